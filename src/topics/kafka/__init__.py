"""Kafka-wire listener: Kafka clients produce to and consume from topics (docs/KAFKA.md)."""

from topics.kafka.server import KafkaServer, start_kafka

__all__ = ["KafkaServer", "start_kafka"]
