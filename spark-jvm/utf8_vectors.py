"""Write UTF-8 validity vectors (Python's strict decode) for Utf8Check.

Usage: python spark-jvm/utf8_vectors.py OUT
Every 1- and 2-byte input with a lead byte >= 0x80, boundary code points and
their encoded neighbours (overlongs, surrogates, > U+10FFFF, cut sequences),
and random mixes of valid text with stray bytes.
"""

import random
import sys

rng = random.Random(7)
rows: list[bytes] = [b""]
rows += [bytes([a]) for a in range(256)]
rows += [bytes([a, b]) for a in range(0x80, 256) for b in range(256)]
for cp in (0x7F, 0x80, 0x7FF, 0x800, 0xD7FF, 0xE000, 0xFFFD, 0xFFFF, 0x10000, 0x10FFFF):
    e = chr(cp).encode()
    rows += [e, e[:-1], b"a" + e + b"z"]
for lead in (0xE0, 0xED, 0xEF, 0xF0, 0xF4, 0xF5):
    for b2 in range(0x80, 0xC0):
        rows += [bytes([lead, b2, 0x80]), bytes([lead, b2, 0x80, 0x80])]
text = "aé€😀\u07ff\uffff\U0010ffff"
for _ in range(3000):
    s = "".join(rng.choice(text) for _ in range(rng.randint(0, 12))).encode()
    if rng.random() < 0.5 and s:
        i = rng.randrange(len(s))
        s = s[:i] + bytes([rng.randrange(256)]) + s[i + 1 :]
    rows.append(s)


def ok(b: bytes) -> bool:
    try:
        b.decode()
        return True
    except UnicodeDecodeError:
        return False


with open(sys.argv[1], "w") as f:
    for b in rows:
        f.write(f"{b.hex() or '-'} {int(ok(b))}\n")
print(f"{len(rows)} vectors written to {sys.argv[1]}")
