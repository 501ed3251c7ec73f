"""The sans-I/O engine: topics, retention, reads, deletes, routers, queues, watches.

Nothing in this package performs I/O or reads the wall clock; the asyncio shell
in :mod:`topics.http` (docs/ARCHITECTURE.md, "Layers").
"""

from topics.engine.core import Engine
from topics.engine.topic import Topic
from topics.engine.topic_config import TopicConfig

__all__ = ["Engine", "Topic", "TopicConfig"]
