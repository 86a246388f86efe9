"""The CUDA paths: the graph torch.compile sees (checked on any machine), the SDPA kernels and bf16 autocast
against float32 on the CPU (skipped without a GPU; run on an H200 for docs/benchmarks.md)."""
import pytest
import torch

from model import GPT, GPTConfig

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def model_and_batch(pos_emb, T=64, V=128):
    torch.manual_seed(0)
    x, y = torch.randint(V, (2, 2, T))
    return GPT(GPTConfig(block_size=T, vocab_size=V, n_layer=2, n_head=2, n_embd=64, pos_emb=pos_emb)), x, y


@pytest.mark.parametrize("pos_emb", ["rope", "alibi"])
def test_the_training_forward_is_one_graph(pos_emb):
    # a graph break (the rotary tables' cache key once went through json.dumps) splits what inductor can fuse
    model, x, y = model_and_batch(pos_emb)
    explained = torch._dynamo.explain(model)(x, y)
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons


@cuda
@pytest.mark.parametrize("pos_emb,flash", [("rope", True), ("learned", True), ("none", True), ("alibi", False)])
def test_sdpa_kernels_under_bf16_autocast_match_the_cpu(pos_emb, flash):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    model, x, y = model_and_batch(pos_emb)
    with torch.no_grad():
        _, reference = model(x, y)
    model.cuda()
    backends = [SDPBackend.FLASH_ATTENTION] if flash else [SDPBackend.EFFICIENT_ATTENTION]  # a bias mask: no flash
    with sdpa_kernel(backends), torch.autocast("cuda", dtype=torch.bfloat16):
        _, loss = model(x.cuda(), y.cuda())
    loss.backward()
    assert abs(loss.item() - reference.item()) < 1e-3
    if not flash:
        with pytest.raises(RuntimeError), sdpa_kernel([SDPBackend.FLASH_ATTENTION]), torch.autocast("cuda", dtype=torch.bfloat16):
            model(x.cuda(), y.cuda())
