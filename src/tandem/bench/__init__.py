"""Workloads and runners for tandem's benchmarks and demo (no torchvision needed)."""
