"""Durable storage: the Fs seam now; WAL, segments, snapshots and recovery build on it."""

from topics.storage.fs import File, Fs, RealFs

__all__ = ["File", "Fs", "RealFs"]
