"""The tools around the pipeline: synthetic data (generate), the local Kafka broker and Spark
cluster, the code packed for spark-submit, SQL over the lake and its JDBC server, the demo."""
