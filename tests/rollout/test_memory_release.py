"""The colocated hand-off on the torch engine: `release_memory` frees the KV buffers and the cached
prefixes (bytes reported, nothing held after), and a generation after it samples exactly as before."""

from stratarl.rollout.interface import GenerationRequest, SamplingParams
from tests.rollout.tiny_lm import build_tiny_qwen2

PROMPTS = [(5, 9, 14), (7, 21, 8, 30, 11), (5, 9, 14), (40, 2)]


def sampled(engine):
    params = [SamplingParams(temperature=1.0, max_tokens=6, seed=i) for i in range(len(PROMPTS))]
    requests = [
        GenerationRequest(f"r{i}", p, s) for i, (p, s) in enumerate(zip(PROMPTS, params, strict=True))
    ]
    return [(r.response_ids, r.log_probs) for r in engine.generate(requests)]


def test_release_frees_the_kv_cache_and_changes_no_sample(make_engine):
    engine = make_engine(build_tiny_qwen2(seed=0))
    first = sampled(engine)
    core = engine._core
    held = core.cache.num_bytes + core.store.num_bytes
    assert core.cache.num_bytes > 0 and len(core.store) > 0  # buffers and prompt prefixes stay by default
    assert engine.release_memory() == held
    assert core.cache.num_bytes == 0 and core.store.num_bytes == 0 and len(core.store) == 0
    assert engine.release_memory() == 0  # nothing left to free
    assert sampled(engine) == first  # the cache is rebuilt on demand: same tokens, same log-probs
    assert core.cache.num_bytes > 0
