"""PySpark border jobs: datasets become transaction requests (producer_job), change data
lands in Delta Lake tables (changes_job, lake), over Spark's own Kafka connector (kafka_connector)
with Ordo's record format in records. See docs/spark.md."""
