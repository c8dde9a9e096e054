#!/usr/bin/env python3
"""MD5 over a dfp checkpoint's tensor records (every record but "meta"), in file order: each
record's name bytes, then its floats' bytes (the digest the project has tracked since session 16).

The training-bits check: a refactor must leave this digest unchanged for a fixed command, e.g.
  build/dfp train --model resnet20 --dataset fashion-mnist --precision int16 --epochs 1 \
    --batch-size 64 --threads 2 --seed 3 --limit-train 1280 --limit-test 500 --out DIR
  scripts/checkpoint_md5.py DIR/checkpoint.dfp
Layout (src/io/checkpoint.cpp): "DFPCKPT1", records [u32 name length][name][u64 float count][floats],
then a u32 CRC-32 of everything before it.
"""
import hashlib
import struct
import sys


def tensor_md5(path):
    data = open(path, "rb").read()
    if data[:8] != b"DFPCKPT1":
        raise SystemExit(f"{path}: not a dfp checkpoint (magic {data[:8]!r})")
    pos, end, h = 8, len(data) - 4, hashlib.md5()
    while pos < end:
        (n,) = struct.unpack_from("<I", data, pos)
        name = data[pos + 4:pos + 4 + n]
        (count,) = struct.unpack_from("<Q", data, pos + 4 + n)
        body_end = pos + 12 + n + 4 * count
        if body_end > end:
            raise SystemExit(f"{path}: record {name!r} runs past the end of the file")
        if name != b"meta":
            h.update(name)
            h.update(data[pos + 12 + n:body_end])
        pos = body_end
    return h.hexdigest()


if __name__ == "__main__":
    if len(sys.argv) < 2:
        raise SystemExit("usage: checkpoint_md5.py CHECKPOINT...")
    for p in sys.argv[1:]:
        print(tensor_md5(p), p)
