"""tandem.web: ``tandem dashboard``, a live local page of the job manager.

What it owns: the web application and its JSON API (:mod:`.app`), what the API reads of the
state and the MLflow store (:mod:`.data`), the live event stream (:mod:`.live`), the access
rules (:mod:`.access`: a token, loopback Host, same-origin writes) and the server
(:mod:`.server`), with the page's static files. It reads the job manager's state and asks
its daemon (cancel); it may import :mod:`tandem.place`, :mod:`tandem.select`,
:mod:`tandem.watch` and :mod:`tandem.share`, and nothing imports it but the command line.
"""
