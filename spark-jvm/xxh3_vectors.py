"""Write XXH3-64 test vectors (Python's xxhash, seed 0) for Xxh3Check.

Usage: python spark-jvm/xxh3_vectors.py OUT
Lengths 0..300 (three random inputs each, plus all-zero and all-0xFF), and
larger ones around the block and stripe boundaries of the long-input path.
"""

import random
import sys

import xxhash

rng = random.Random(20261126)
lens = list(range(0, 301)) * 3
lens += [1023, 1024, 1025, 1087, 1088, 1089, 2047, 2048, 2049, 4096, 5000, 65535, 100_003, 1 << 20]
rows = []
for n in lens:
    rows.append(rng.randbytes(n))
for n in (0, 1, 3, 4, 8, 9, 16, 17, 128, 129, 240, 241, 1024):
    rows.append(b"\x00" * n)
    rows.append(b"\xff" * n)
with open(sys.argv[1], "w") as f:
    for b in rows:
        f.write(f"{b.hex() or '-'} {xxhash.xxh3_64_intdigest(b)}\n")
print(f"{len(rows)} vectors written to {sys.argv[1]}")
