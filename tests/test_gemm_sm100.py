"""Static verification of the Blackwell (sm_100a) NVFP4 GEMM (DESIGN.md §7).

No Blackwell GPU exists here, so the path is checked without running it:
- the tiled scale layout is CUTLASS's own Sm1xxBlockScaledConfig<16> / OutputConfig layout,
  evaluated on the host with cute (tests/host/scale_layout_cutlass.cc);
- the launch plan and CUTLASS arguments of cuda/gemm/sm100/gemm_sm100_args.h (the header the
  launcher uses) match expectations computed here independently (tests/host/gemm_sm100_args.cc);
- the compiled kernels hold the block-scaled NVFP4 tcgen05 MMA, the shared->TMEM scale copy
  and TMA loads in their SASS.
"""

import re
from pathlib import Path

import pytest

HOST = Path(__file__).parent / "host"

# CUTLASS's block-scaled sm100 mainloop appears in the mangled name of every GEMM kernel.
GEMM_KERNELS = r"GemmUniversal.*MainloopSm100TmaUmmaWarpSpecializedBlockScaled"


def _ceil(a, b):
    return -(-a // b)


def _round_up(a, b):
    return _ceil(a, b) * b


def test_scale_layout_equals_cutlass_layouts(host_program):
    out = host_program(HOST / "scale_layout_cutlass.cc", cutlass=True)
    rows = [line.split() for line in out.splitlines()]
    assert len(rows) == 7 * 7 + 2
    batched = 0
    for r, k, batch, checked, bad_a, bad_b, bad_d, bad_design, size_ok in rows:
        assert int(checked) == int(r) * int(k) * int(batch)
        assert (bad_a, bad_b, bad_d, bad_design) == ("0", "0", "0", "0"), (r, k, batch)
        assert size_ok == "1", (r, k, batch)
        batched += int(batch) > 1
    assert batched == 2


def _plan(host_program, m, n, k, a_nvfp4, out, bias, sms=148, qws=4096):
    text = host_program(HOST / "gemm_sm100_args.cc", cutlass=True,
                        args=(m, n, k, int(a_nvfp4), out, bias, sms, qws))
    return dict(line.split("=", 1) for line in text.splitlines())


def _expected(m, n, k, a_nvfp4, out, bias, sms, qws):
    """The plan as documented in docs/gemm_blackwell.md, computed independently."""
    bits = {"f32": 32, "f16": 32, "bf16": 16, "nvfp4": 4}[out]
    k_pad = _round_up(k, 32)
    n_pad = _round_up(n, 128 // bits)
    quantize = not a_nvfp4
    pad_a = k_pad != k
    pad_b = k_pad != k or n_pad != n
    copy_bias = bias != "none" and (bias != "f32" or n_pad != n)
    stage = n_pad != n or out == "f16"
    e = dict(k_pad=k_pad, n_pad=n_pad, quantize_a=quantize, pad_a=pad_a, pad_b=pad_b,
             copy_bias=copy_bias, stage_out=stage,
             two_sm=m >= 256 and _ceil(m, 256) * _ceil(n, 128) >= sms // 2)
    top, offs = 0, {}

    def take(name, nbytes, used=True):
        nonlocal top
        offs[name] = top if used else None
        if used:
            top += _round_up(nbytes, 256)

    scale_bytes = _ceil(m, 128) * _ceil(k // 16, 4) * 512
    take("scalars", 4)
    take("a_codes", m * k // 2, quantize)
    take("a_scales", scale_bytes, quantize)
    take("a_s_dec", 4, quantize)
    take("quantize_ws", qws, quantize)
    take("a_padded", m * k_pad // 2, pad_a)
    take("b_padded", n_pad * k_pad // 2, pad_b)
    take("bias", n_pad * 4, copy_bias)
    take("out_staged", m * n_pad * bits // 8, stage)
    offs["cutlass"] = top
    e["offs"] = offs
    return e


SHAPES = [
    # m, n, k, a_nvfp4, out, bias
    (1, 4096, 4096, True, "bf16", "none"),       # decode, aligned: no copies at all
    (1, 4096, 4096, False, "bf16", "bf16"),      # W4A16 decode: quantize A, bias -> f32
    (4096, 14336, 4096, True, "f32", "f32"),     # prefill: 2-SM tiles, f32 bias used in place
    (300, 200, 80, True, "bf16", "f32"),         # K tail (80 -> 96), N tail (200 -> 208)
    (129, 100, 16, False, "f16", "none"),        # f16 via staged f32, N 100 -> 104, K 16 -> 32
    (384, 208, 48, False, "nvfp4", "bf16"),      # NVFP4 out: codes staged (208 -> 224)
    (512, 2048, 1024, True, "nvfp4", "none"),    # NVFP4 out, aligned
    (255, 8192, 256, True, "bf16", "none"),      # m < 256 stays on 1-SM tiles
]


@pytest.mark.parametrize("m,n,k,a_nvfp4,out,bias", SHAPES)
def test_launch_plan_and_arguments(host_program, m, n, k, a_nvfp4, out, bias):
    sms, qws = 148, 4096
    got = _plan(host_program, m, n, k, a_nvfp4, out, bias, sms, qws)
    e = _expected(m, n, k, a_nvfp4, out, bias, sms, qws)
    assert got["unsupported"] == "none"
    assert int(got["kind"]) == {"f32": 0, "f16": 0, "bf16": 1, "nvfp4": 2}[out]
    for key in ("k_pad", "n_pad"):
        assert int(got[key]) == e[key], key
    for key in ("two_sm", "quantize_a", "pad_a", "pad_b", "copy_bias", "stage_out"):
        assert got[key] == str(int(e[key])), key
    assert int(got["quantize_ws_bytes"]) == (qws if e["quantize_a"] else 0)
    for name, off in e["offs"].items():
        assert got[f"off_{name}"] == ("unused" if off is None else str(off)), name

    k_pad, n_pad, offs = e["k_pad"], e["n_pad"], e["offs"]
    assert got["problem"] == f"{m},{n_pad},{k_pad}"
    assert got["stride_a"] == f"{k_pad},1,{m * k_pad}"
    assert got["stride_b"] == f"{k_pad},1,{n_pad * k_pad}"
    assert got["stride_d"] == f"{n_pad},1,{m * n_pad}"

    def ws(name):
        return f"ws+{offs[name]}"

    a_src = ws("a_codes") if e["quantize_a"] else "a_codes+0"
    assert got["ptr_a"] == (ws("a_padded") if e["pad_a"] else a_src)
    assert got["ptr_b"] == (ws("b_padded") if e["pad_b"] else "b_codes+0")
    assert got["ptr_sfa"] == (ws("a_scales") if e["quantize_a"] else "a_scales+0")
    assert got["ptr_sfb"] == "b_scales+0"
    final = "out_codes+0" if out == "nvfp4" else "out+0"
    assert got["ptr_d"] == (ws("out_staged") if e["stage_out"] else final)
    assert got["ptr_alpha"] == ws("scalars")
    expected_bias = "null" if bias == "none" else ("bias+0" if not e["copy_bias"] else ws("bias"))
    assert got["ptr_bias"] == expected_bias
    assert got["ptr_workspace"] == ws("cutlass")
    assert got["sfa_ok"] == "1" and got["sfb_ok"] == "1"
    if out == "nvfp4":
        assert got["ptr_sfd"] == "out_scales+0"
        assert got["ptr_norm"] == "out_s_enc+0"
        assert got["sfd_ok"] == "1"
    else:
        assert got["ptr_sfd"] == "null" and got["ptr_norm"] == "null"


def test_two_sm_rule_follows_sm_count(host_program):
    # 512 x 4096: 2 x 32 = 64 tiles of 256x128 -> 2-SM when they fill half of the SMs.
    assert _plan(host_program, 512, 4096, 256, True, "bf16", "none", sms=128)["two_sm"] == "1"
    assert _plan(host_program, 512, 4096, 256, True, "bf16", "none", sms=148)["two_sm"] == "0"


@pytest.mark.parametrize("m,n,k,out,reason", [
    (16, 64, 40, "bf16", "k must be a multiple of 16"),
    (16, 64, 0, "bf16", "m and n must be >= 0 and k > 0"),
    (16, 40, 64, "nvfp4", "NVFP4 output needs n % 16 == 0"),
])
def test_unsupported_problems_are_named(host_program, m, n, k, out, reason):
    assert _plan(host_program, m, n, k, True, out, "none")["unsupported"] == reason


def test_sass_holds_block_scaled_tcgen05_mma(kernel_sass):
    funcs = kernel_sass("sm_100a", GEMM_KERNELS)
    # f32, bf16 and NVFP4 outputs, each with 1-SM and 2-SM tiles.
    assert len(funcs) == 6, sorted(funcs)
    two_sm = 0
    for name, sass in funcs.items():
        mma = re.findall(r"\bUTCOMMA(\.2CTA)?\.4X\b", sass)  # kind::mxf4nvf4, scale_vec::4X
        assert mma, name
        assert re.search(r"\bUTCCP\.T\.S(\.2CTA)?\.4x32dp128bit\b", sass), name  # scales -> TMEM
        assert re.search(r"\bUTMALDG\.[345]D\b", sass), name
        two_sm += all(m == ".2CTA" for m in mma)
    assert two_sm == 3
