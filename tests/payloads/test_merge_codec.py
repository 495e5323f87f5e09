"""The merge's torch-free float codec rounds exactly like torch's casts (bf16 round-to-nearest-even)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from llm_pipeline.weights.float_codec import decode, encode

pytestmark = pytest.mark.both_stacks

SPECIAL = [
    0.0,
    -0.0,
    1.0,
    -1.0,
    float("inf"),
    float("-inf"),
    float("nan"),
    3.4e38,
    -3.4e38,
    1e-40,
    -1e-42,
    1.00390625,
    1.01171875,
]


@pytest.mark.parametrize(("code", "dtype"), [("BF16", torch.bfloat16), ("F16", torch.float16), ("F32", torch.float32)])
def test_encode_and_decode_match_torch_bit_for_bit(code, dtype):
    generator = torch.Generator().manual_seed(0)
    magnitudes = 10.0 ** torch.randint(-30, 30, (200_000,), generator=generator).float()
    values = torch.cat([torch.randn(200_000, generator=generator) * magnitudes, torch.tensor(SPECIAL)]).float()
    ours = encode(values.numpy().copy(), code)  # encode may reuse its input's memory
    theirs = values.to(dtype)
    numbers = ~torch.isnan(values).numpy()  # NaN payloads may differ; NaN stays NaN (checked below)
    bits = {2: np.uint16, 4: np.uint32}[dtype.itemsize]
    assert np.array_equal(
        ours.view(bits)[numbers],
        theirs.view({2: torch.int16, 4: torch.int32}[dtype.itemsize]).numpy().view(bits)[numbers],
    )
    back = decode(ours.tobytes(), code)
    assert back.dtype == np.float32 and np.array_equal(back, theirs.float().numpy(), equal_nan=True)
