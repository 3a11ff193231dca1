# The dealing of docs/experiments/whole-tiles.patch, simulated: a block's stream of my_tiles x steps
# super-steps cut into contiguous warp ranges; checks that every tile's steps are summed once, in
# stream order, and every tile stored once (whole by its warp, or cut and added up at the end).
# python3 docs/experiments/whole_tiles_sim.py
def run(my_tiles, steps, W=8):
    total = my_tiles*steps if my_tiles > 0 else 0
    workers = min(total, W)
    begin = lambda w: (total*w)//workers
    parts = {}   # (slot, warp) -> list of (tile, step) summed
    stored = {}  # tile -> list of steps in order
    for warp in range(workers):
        mb, me = begin(warp), begin(warp+1)
        first_tile = mb//steps
        tile, s, left = first_tile, mb - first_tile*steps, me-mb
        whole = s == 0
        acc = []
        while left > 0:
            acc.append((tile, s))
            left -= 1; s += 1
            if s == steps or left == 0:
                if whole and s == steps:
                    assert tile not in stored; stored[tile] = [x for x in acc]
                else:
                    slot = 0 if tile == first_tile else 1
                    assert (slot, warp) not in parts
                    parts[(slot, warp)] = acc
                acc = []
                if s == steps:
                    s = 0; tile += 1; whole = True
    # handlers
    for warp in range(workers):
        mb, me = begin(warp), begin(warp+1)
        last_tile = (me-1)//steps
        if me % steps == 0 or mb > last_tile*steps: continue
        v = []
        w = warp
        while w < workers and begin(w) < (last_tile+1)*steps:
            slot = 0 if begin(w)//steps == last_tile else 1
            v += parts.pop((slot, w))
            w += 1
        assert last_tile not in stored; stored[last_tile] = v
    assert not parts, parts
    assert sorted(stored) == list(range(my_tiles)), (sorted(stored), my_tiles)
    for t, v in stored.items():
        assert v == [(t, s) for s in range(steps)], (t, v)
for my_tiles in range(0, 40):
    for steps in range(1, 70):
        for W in (8, 16):
            run(my_tiles, steps, W)
print("ok")
import random
random.seed(1)
for _ in range(3000):
    run(random.randint(0, 400), random.randint(1, 300), random.choice((8, 16)))
print("random ok")
