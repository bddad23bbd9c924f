"""Where a run is kept: run stores behind the :class:`RunStore` protocol.

- ``base``: the protocol and the default location (``$MLFLOW_TRACKING_URI`` or ``./mlflow.db``);
- ``mlflow_store``: :class:`MlflowStore`, any MLflow tracking URI (MLflow imported on open,
  where the store needs it);
- ``sqlite_writer``: a SQLite store's run tables written as MLflow writes them, no MLflow import;
- ``runs_reader``: runs read back for reports (a SQLite store's tables, or MLflow's client);
- ``file_store``: :class:`FileStore`, a plain directory per run (no MLflow needed);
- ``csv_file``: the ``metrics.csv`` format a file-store run is written in and read back from.
"""

from tandem.watch.stores.base import RunStore, default_store_uri
from tandem.watch.stores.file_store import FileStore
from tandem.watch.stores.mlflow_store import MlflowStore

__all__ = ["FileStore", "MlflowStore", "RunStore", "default_store_uri"]
