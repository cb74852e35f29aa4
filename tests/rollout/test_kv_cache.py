"""SlotKVCache against a plain per-row list of KV columns: admit (n copies), decode writes, removal by
moving rows, growth and relayout keep every live row's KV and its mask exactly."""

import torch

from stratarl.rollout.kv_cache import SlotKVCache

H, D, LAYERS = 2, 3, 2


def block(length: int, g: torch.Generator) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [
        (torch.randn(1, H, length, D, generator=g), torch.randn(1, H, length, D, generator=g))
        for _ in range(LAYERS)
    ]


def live(cache: SlotKVCache, row: int, layer: int) -> torch.Tensor:
    s = int(cache.start[row])
    return cache.keys[layer][row, :, s : cache.cursor]


def test_random_admit_decode_remove_sequence_matches_a_plain_list():
    g = torch.Generator().manual_seed(0)
    cache = SlotKVCache(initial_rows=2, initial_columns=8)  # small, so growth and relayout happen
    reference: list[list[torch.Tensor]] = []  # per row, per layer: keys [H, L, D]
    for step in range(40):
        action = torch.randint(0, 3, (), generator=g).item()
        if action == 0 or not reference:  # admit a prefix of random length, copied 1-3 ways
            length, copies = (
                int(torch.randint(1, 12, (), generator=g)),
                int(torch.randint(1, 4, (), generator=g)),
            )
            kv = block(length, g)
            cache.admit(kv, copies=copies)
            reference += [[k[0].clone() for k, _ in kv] for _ in range(copies)]
        elif action == 1:  # a decode step: every row writes one new column
            cache.ensure_columns(1)
            mask = cache.decode_mask()  # [n, span]
            new = torch.randn(len(reference), H, 1, D, generator=g)
            for layer in range(LAYERS):
                keys, _ = cache.update(new, new, layer)
                assert keys.shape[2] == mask.shape[1]
            cache.advance()
            for r, row in enumerate(reference):
                for layer in range(LAYERS):
                    row[layer] = torch.cat([row[layer], new[r]], dim=1)
                assert int(mask[r].sum()) == row[0].shape[1]  # a row attends to its own columns only
        else:  # some rows finish
            finished = sorted({int(torch.randint(0, len(reference), (), generator=g)) for _ in range(2)})
            order = cache.remove(finished)
            kept = [r for r in range(len(reference)) if r not in finished]
            assert sorted(order.tolist()) == kept
            reference = [reference[j] for j in order.tolist()]
        assert cache.num_rows == len(reference)
        for r, row in enumerate(reference):
            for layer in range(LAYERS):
                assert torch.equal(live(cache, r, layer), row[layer]), (step, r, layer)


def test_row_kv_copies_one_rows_columns():
    g = torch.Generator().manual_seed(1)
    cache = SlotKVCache()
    short, long = block(2, g), block(5, g)
    cache.admit(long, copies=1)
    cache.admit(short, copies=1)  # right-aligned: starts 3 columns later
    assert cache.start[:2].tolist() == [0, 3] and cache.cursor == 5
    (k, v), _ = cache.row_kv(1)
    assert torch.equal(k, short[0][0]) and torch.equal(v, short[0][1])


def test_a_prefix_longer_than_the_timeline_shifts_live_rows_right():
    g = torch.Generator().manual_seed(2)
    cache = SlotKVCache(initial_columns=4)
    first, longer = block(2, g), block(6, g)
    cache.admit(first, copies=2)
    cache.admit(longer, copies=1)
    assert cache.cursor == 6 and cache.start[:3].tolist() == [4, 4, 0]
    assert torch.equal(live(cache, 0, 1), first[1][0][0]) and torch.equal(live(cache, 2, 0), longer[0][0][0])
