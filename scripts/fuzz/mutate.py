"""The changes the fuzzers make to what a sender sends (imported by the scripts beside it)."""

import random


def mutate(data: bytes, rng: random.Random, kinds: int = 5) -> bytes:
    """`data` with one kind of change of the first `kinds`, drawn from `rng`: a few bytes set at
    random, cut short at random, bytes inserted, a bit flipped, or (the fifth) a chunk of it
    repeated where it starts."""
    out = bytearray(data)
    kind = rng.randrange(kinds)
    if kind == 0:
        for _ in range(rng.randint(1, 8)):
            out[rng.randrange(len(out))] = rng.randrange(256)
    elif kind == 1:
        out = out[: rng.randrange(len(out))]
    elif kind == 2:
        at = rng.randrange(len(out))
        out[at:at] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 16)))
    elif kind == 3:
        out[rng.randrange(len(out))] ^= 1 << rng.randrange(8)
    else:
        at = rng.randrange(len(out))
        out[at:at] = out[at : min(len(out), at + rng.randint(1, 4096))]
    return bytes(out)
