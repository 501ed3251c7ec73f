from topics.format.frame import Buf

def render(
    out: list[bytes],
    buf: Buf,
    base: int,
    seqs: object,
    offs: object,
    lens: object,
    tss: object,
    hdr: int,
    verify: bool,
    include_tags: bool,
    include_meta: bool,
    include_data: bool,
    /,
) -> tuple[int, str] | None: ...
