"""PySpark border jobs: datasets become transaction requests (producer_job), change data
becomes Parquet tables (changes_job), through Python data sources over Kafka
(requests_sink, changes_source). See docs/spark.md."""
