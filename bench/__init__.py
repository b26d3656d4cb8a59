"""leoflow benchmarks: LocalExecutor vs LeoflowExecutor (Lite) on a real Airflow; see ``bench.compare``."""
