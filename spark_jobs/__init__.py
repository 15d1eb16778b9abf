"""PySpark border jobs: datasets become transaction requests (producer_job), change data
becomes Parquet tables (changes_job), over Spark's own Kafka connector (kafka_connector)
with Ordo's record format in records. See docs/spark.md."""
