from typing import Any

def encode_batch(
    topic_id: int, first_seq: int, ts: int, records: list[Any], durable: bool, /
) -> tuple[bytes, list[int]]: ...
def segment_frames(bufs: list[Any], which: object, offs: object, lens: object, /) -> bytes: ...
def prepare_records(
    records: list[Any],
    batch_node: str | None,
    record_type: type[Any],
    dumps: Any,
    max_record_bytes: int,
    max_meta_bytes: int,
    max_meta_keys: int,
    max_tag_bytes: int,
    max_node_bytes: int,
    /,
) -> list[Any] | None: ...
