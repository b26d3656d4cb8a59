"""Developer tools for leoflow: a throwaway real Airflow stack and the demo. Not shipped."""
