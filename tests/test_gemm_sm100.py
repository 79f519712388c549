"""Static verification of the Blackwell (sm_100a) NVFP4 GEMM (DESIGN.md §7).

No Blackwell GPU exists here, so the path is checked without running it:
- the tiled scale layout is CUTLASS's own Sm1xxBlockScaledConfig<16> / OutputConfig layout,
  evaluated on the host with cute (tests/host/scale_layout_cutlass.cc);
- the launch plan and CUTLASS arguments of cuda/gemm/sm100/gemm_sm100_args.h (the header the
  launcher uses) match expectations computed here independently (tests/host/gemm_sm100_args.cc);
- CUTLASS's own Gemm::can_implement accepts every planned problem (and rejects the unpadded
  ones), evaluated on the host (tests/host/gemm_sm100_can_implement.cu);
- the compiled kernels hold the block-scaled NVFP4 tcgen05 MMA, the shared->TMEM scale copy
  and TMA loads in their SASS.
On a Blackwell GPU the last tests run the path against the float64 oracle (its first execution).
"""

import importlib.util
import re
import shutil
import subprocess
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_nvfp4 as jn

HOST = Path(__file__).parent / "host"
_spec = importlib.util.spec_from_file_location("matmul_cases", Path(__file__).parent / "matmul_cases.py")
mc = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(mc)

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


ACTIVATION_CODES = {"none": 0, "relu": 1, "gelu": 2, "silu": 3, "swiglu": 4, "geglu": 5}


def _plan(host_program, m, n, k, a_nvfp4, out, bias, sms=148, qws=4096, activation="none"):
    text = host_program(HOST / "gemm_sm100_args.cc", cutlass=True,
                        args=(m, n, k, int(a_nvfp4), out, bias, sms, qws,
                              ACTIVATION_CODES[activation]))
    return dict(line.split("=", 1) for line in text.splitlines())


def _expected(m, n, k, a_nvfp4, out, bias, sms, qws, activation="none"):
    """The plan as documented in docs/gemm_blackwell.md, computed independently."""
    act = activation != "none"  # D is float32, then a pass applies the activation
    gated = activation in ("swiglu", "geglu")  # D [m, n] -> output [m, n / 2]: never in place
    bits = 32 if act else {"f32": 32, "f16": 32, "bf16": 16, "nvfp4": 4}[out]
    k_pad = _round_up(k, 32)
    n_pad = _round_up(n, 128 // bits)
    quantize = not a_nvfp4
    pad_a = k_pad != k
    pad_b = k_pad != k or n_pad != n
    copy_bias = bias != "none" and (bias != "f32" or n_pad != n)
    stage = n_pad != n or out == "f16" or (act and out != "f32") or gated
    e = dict(k_pad=k_pad, n_pad=n_pad, quantize_a=quantize, pad_a=pad_a, pad_b=pad_b,
             copy_bias=copy_bias, stage_out=stage, activation_pass=act,
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
    take("activated", m * (n // 2) * 4, gated and out == "nvfp4")
    offs["cutlass"] = top
    e["offs"] = offs
    return e


SHAPES = [
    # m, n, k, a_nvfp4, out, bias
    (1, 4096, 4096, True, "bf16", "none"),       # decode, aligned: no copies at all
    (1, 4096, 4096, False, "bf16", "bf16"),      # W4A16 decode: quantize A, bias -> f32
    (4096, 14336, 4096, True, "f32", "f32"),     # prefill: 2-SM tiles, f32 bias used in place
    (300, 200, 80, True, "bf16", "f32"),         # K tail (80 -> 96); 200 is bf16-aligned
    (300, 200, 80, True, "f32", "f32"),          # ... and f32-aligned
    (7, 100, 64, True, "bf16", "f32"),           # N tail for bf16 (100 -> 104): f32 bias padded
    (129, 100, 16, False, "f16", "none"),        # f16 via staged f32, N 100 -> 104, K 16 -> 32
    (384, 208, 48, False, "nvfp4", "bf16"),      # NVFP4 out: codes staged (208 -> 224)
    (512, 2048, 1024, True, "nvfp4", "none"),    # NVFP4 out, aligned
    (255, 8192, 256, True, "bf16", "none"),      # m < 256 stays on 1-SM tiles
]
# With an activation D is float32 (CUTLASS's epilogue here has none), staged unless it is the
# float32 output, and a pass applies it (then the cast, or the NVFP4 output quantization).
ACTIVATION_SHAPES = [
    (1, 4096, 4096, True, "bf16", "none", "silu"),   # staged f32, cast by the pass
    (300, 200, 80, True, "f32", "f32", "relu"),      # f32 output: the pass runs in place
    (7, 100, 64, True, "bf16", "f32", "gelu"),       # N tail: f32 pitch 100 (no pad needed)
    (7, 102, 64, True, "f32", "none", "relu"),       # f32 N tail 102 -> 104: staged
    (512, 2048, 1024, False, "nvfp4", "bf16", "gelu"),  # NVFP4 out: f32 staged, then quantized
    # Gated: D [m, n] is always staged, the pass writes [m, n / 2] (its own f32 region before an
    # NVFP4 output's quantization).
    (1, 8192, 4096, True, "bf16", "none", "swiglu"),
    (300, 200, 80, True, "f32", "f32", "geglu"),     # f32 output: staged all the same
    (512, 4096, 1024, False, "nvfp4", "bf16", "swiglu"),
]


@pytest.mark.parametrize("m,n,k,a_nvfp4,out,bias,activation",
                         [s + ("none",) for s in SHAPES] + ACTIVATION_SHAPES)
def test_launch_plan_and_arguments(host_program, m, n, k, a_nvfp4, out, bias, activation):
    sms, qws = 148, 4096
    got = _plan(host_program, m, n, k, a_nvfp4, out, bias, sms, qws, activation)
    e = _expected(m, n, k, a_nvfp4, out, bias, sms, qws, activation)
    assert got["unsupported"] == "none"
    kinds = {"f32": 0, "f16": 0, "bf16": 1, "nvfp4": 2}
    assert int(got["kind"]) == (0 if e["activation_pass"] else kinds[out])
    for key in ("k_pad", "n_pad"):
        assert int(got[key]) == e[key], key
    for key in ("two_sm", "quantize_a", "pad_a", "pad_b", "copy_bias", "stage_out",
                "activation_pass"):
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
    if out == "nvfp4" and not e["activation_pass"]:
        assert got["ptr_sfd"] == "out_scales+0"
        assert got["ptr_norm"] == "out_s_enc+0"
        assert got["sfd_ok"] == "1"
    else:
        assert got["ptr_sfd"] == "null" and got["ptr_norm"] == "null"


def test_two_sm_rule_follows_sm_count(host_program):
    # 512 x 4096: 2 x 32 = 64 tiles of 256x128 -> 2-SM when they fill half of the SMs.
    assert _plan(host_program, 512, 4096, 256, True, "bf16", "none", sms=128)["two_sm"] == "1"
    assert _plan(host_program, 512, 4096, 256, True, "bf16", "none", sms=148)["two_sm"] == "0"


NVFP4_COLS = "NVFP4 output needs its columns (n, or n / 2 gated) a multiple of 16"


@pytest.mark.parametrize("m,n,k,out,activation,reason", [
    (16, 64, 40, "bf16", "none", "k must be a multiple of 16"),
    (16, 64, 0, "bf16", "none", "m and n must be >= 0 and k > 0"),
    (16, 40, 64, "nvfp4", "none", NVFP4_COLS),
    (16, 48, 64, "nvfp4", "swiglu", NVFP4_COLS),  # 24 output columns
    (16, 33, 64, "bf16", "geglu", "a gated activation needs n even"),
])
def test_unsupported_problems_are_named(host_program, m, n, k, out, activation, reason):
    got = _plan(host_program, m, n, k, True, out, "none", activation=activation)
    assert got["unsupported"] == reason


def _ptx_host_program(tmp_path_factory, source):
    """Builds host program `source` (CUTLASS's can_implement calls: host code) with nvcc as PTX
    only, no ptxas (about 30 s of CPU); returns a function running it with arguments and giving
    its output's rows, split."""
    nvcc = shutil.which("nvcc")
    try:
        import cutlass_library
    except ImportError:
        cutlass_library = None
    if nvcc is None or cutlass_library is None:
        pytest.skip("needs nvcc and the nvidia-cutlass headers")
    inc = Path(cutlass_library.__file__).parent / "source" / "include"
    exe = tmp_path_factory.mktemp(source.stem) / source.stem
    subprocess.run([nvcc, "-std=c++17", "--expt-relaxed-constexpr", "-I", str(HOST.parent.parent / "cuda"),
                    "-isystem", str(inc), "-gencode=arch=compute_100a,code=compute_100a",
                    str(source), "-o", str(exe)],
                   check=True, capture_output=True, text=True)

    def run(*args):
        out = subprocess.run([str(exe), *args], check=True, capture_output=True, text=True).stdout
        return [line.split() for line in out.splitlines()]

    return run


@pytest.fixture(scope="module")
def can_implement(tmp_path_factory):
    """can_implement(mode, *problems) -> rows of gemm_sm100_can_implement's output."""
    return _ptx_host_program(tmp_path_factory, HOST / "gemm_sm100_can_implement.cu")


CUTLASS_PROBLEMS = ["1,4096,4096,bf16", "3,208,80,f32", "129,100,16,bf16", "300,200,96,f32",
                    "4096,14336,4096,bf16", "255,8,48,f32", "1,1,16,bf16", "7,16,32,nvfp4",
                    "384,208,48,nvfp4", "512,2048,1024,nvfp4"]


def test_cutlass_accepts_every_planned_problem(can_implement):
    rows = can_implement("planned", *CUTLASS_PROBLEMS)
    assert len(rows) == len(CUTLASS_PROBLEMS)
    for m, n, k, out, one_sm, two_sm in rows:
        assert (one_sm, two_sm) == ("1", "1"), (m, n, k, out)


def test_cutlass_rejects_the_problems_the_planner_pads(can_implement):
    # Without the planner's padding CUTLASS refuses K % 32 != 0 and unaligned N: the padding
    # is needed, and the check above is not vacuous.
    for m, n, k, out, one_sm, two_sm in can_implement("unpadded_k", "300,200,80,bf16",
                                                      "5,64,16,nvfp4"):
        assert (one_sm, two_sm) == ("0", "0"), (m, n, k, out)
    for m, n, k, out, one_sm, two_sm in can_implement("unpadded_n", "300,100,64,bf16",
                                                      "5,6,64,f32", "5,48,64,nvfp4"):
        assert (one_sm, two_sm) == ("0", "0"), (m, n, k, out)


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


@pytest.fixture
def blackwell(gpu):
    """The GPU when it is a compute capability 10.x device (where gemm_sm100 runs), else skip."""
    cc = str(getattr(gpu, "compute_capability", ""))
    if not cc.startswith("10."):
        pytest.skip(f"needs a Blackwell (compute capability 10.x) GPU, got {cc or 'none'}")
    return gpu


# Each case takes a different branch of the launch plan (see SHAPES above).
GPU_CASES = [
    # m, n, k, w4a4, out_dtype, bias dtype
    (1, 4096, 1024, True, jnp.bfloat16, None),
    (3, 208, 80, False, jnp.float32, jnp.bfloat16),
    (129, 100, 16, False, jnp.float16, None),
    (1024, 8192, 512, True, jnp.bfloat16, jnp.float32),
    (300, 200, 96, True, jnp.float32, None),
]


@pytest.mark.parametrize("m,n,k,w4a4,out_dtype,bias_dtype", GPU_CASES)
def test_blackwell_gemm_matches_float64(blackwell, m, n, k, w4a4, out_dtype, bias_dtype):
    with jax.default_device(blackwell):
        x = mc.random_float((m, k), jnp.bfloat16, seed=m + k)
        w = mc.random_weight(n, k, seed=n)
        bias = None if bias_dtype is None else mc.random_float((n,), bias_dtype, seed=3)
        xin = jn.quantize(x) if w4a4 else x
        y = jn.matmul(xin, w, bias=bias, out_dtype=out_dtype)
        # W4A16 quantizes x on the device with the library's exact recipe.
        want = mc.oracle(xin if w4a4 else jn.quantize(x), w, bias)
        mc.assert_close(y, want, max(mc.TOL[out_dtype], 1e-5))


def test_blackwell_nvfp4_output_is_close_to_quantized_reference(blackwell):
    # CUTLASS's block-scale epilogue rounds its reciprocals differently from DESIGN §2
    # (docs/gemm_blackwell.md): bytes may differ only on rare rounding boundaries.
    m, n, k, s_enc = 384, 208, 256, np.float32(1500.0)
    with jax.default_device(blackwell):
        x = jn.quantize(mc.random_float((m, k), jnp.bfloat16, seed=21))
        w = mc.random_weight(n, k, seed=22)
        q = jn.matmul(x, w, out_s_enc=s_enc)
        y = jn.matmul(x, w, out_dtype=jnp.float32)
    codes, scales, s_dec = mc.quantize_reference_bytes(y, s_enc)
    got_codes = np.asarray(jax.lax.bitcast_convert_type(q.codes, jnp.uint4)).astype(np.uint8)
    got_scales = np.asarray(q.plain_scales()).view(np.uint8)
    want_scales = jn.format.tiled_to_plain(scales, m, n // 16)
    assert np.mean(got_codes != codes) <= 1e-3
    assert np.mean(got_scales != np.asarray(want_scales)) <= 1e-3
    np.testing.assert_array_equal(np.asarray(q.s_dec), s_dec)


# The ragged path (ragged_matmul on sm_100a: cuda/gemm/sm100/ragged_sm100_plan.h).
RAGGED_CASES = [  # m, n, k, a_nvfp4, first_row, sizes: tails, empty and negative groups, rows past m
    (300, 48, 96, False, 5, [100, -3, 0, 130, 200]),
    (1, 32, 64, True, 0, [0, 1, 0]),
    (700, 20, 160, True, 0, [128, 129, 0, 256, 1]),
    (64, 8, 32, False, 70, [10, 10]),
    (260, 12, 1056, False, 0, [3, 250]),
]


@pytest.mark.parametrize("m,n,k,a_nvfp4,first_row,sizes", RAGGED_CASES)
def test_ragged_plan_places_groups_and_cutlass_reads_their_scales(host_program, m, n, k, a_nvfp4,
                                                                   first_row, sizes):
    """The groups' rows as the setup kernel places them equal reference.ragged_segments; CUTLASS's
    scale layouts from each group's pointers read the bytes the regroup kernel writes (A) and the
    weights' own tiled scales (B); A, B and D are addressed from the group's rows."""
    from jax_nvfp4 import reference

    text = host_program(HOST / "ragged_sm100_plan.cc", cutlass=True,
                        args=(m, n, k, int(a_nvfp4), first_row, *sizes))
    got = dict(line.split("=", 1) for line in text.splitlines())
    assert got["unsupported"] == "none"
    first, ends = reference.ragged_segments(jnp.asarray(sizes, jnp.int32), first_row, m)
    starts = [int(first)] + [int(e) for e in ends[:-1]]
    tiles = 0
    for g, (start, end) in enumerate(zip(starts, [int(e) for e in ends])):
        assert got[f"group{g}"] == f"{start},{end},{tiles}", g
        tiles += _ceil(end - start, 128)
    held = int(ends[-1]) - int(first)
    assert int(got["sfa_checked"]) == held * k and got["sfa_mismatches"] == "0"
    assert int(got["sfb_checked"]) == len(sizes) * n * k and got["sfb_mismatches"] == "0"
    assert (got["a_mismatches"], got["b_mismatches"], got["d_mismatches"]) == ("0", "0", "0")
    assert int(got["tiles_used"]) == tiles <= int(got["tiles_bound"])
    assert got["sfa_region_fits"] == "1"
    assert (int(got["region_a_codes"]) >= 0) == (not a_nvfp4)  # W4A16 quantizes A first


@pytest.mark.parametrize("n,k,reason", [(48, 48, "k must be a multiple of 32"),
                                        (34, 64, "n must be a multiple of 4")])
def test_ragged_plan_names_what_it_cannot_run(host_program, n, k, reason):
    text = host_program(HOST / "ragged_sm100_plan.cc", cutlass=True, args=(8, n, k, 0, 0, 4, 4))
    assert dict(line.split("=", 1) for line in text.splitlines())["unsupported"] == reason


def test_ragged_cutlass_accepts_the_planned_groups_and_rejects_what_the_plan_refuses(tmp_path_factory):
    """CUTLASS's grouped GEMM, given the groups' shapes on the host, accepts every call the plan
    takes (empty groups included) and rejects K not a multiple of 32 or N not of 4, the calls
    ragged_unsupported_reason refuses (the Python side sends them to XLA)."""
    run = _ptx_host_program(tmp_path_factory, HOST / "ragged_sm100_can_implement.cu")
    taken = ["48,96,100,-3,0,130,200", "32,64,0,1,0", "20,160,128,129,0,256,1", "4096,14336,7,0,9"]
    refused = ["48,48,100,200", "34,64,5,5", "4096,4112,3,3"]
    rows = run(*taken, *refused)
    assert [r[2] for r in rows] == ["1"] * len(taken) + ["0"] * len(refused), rows


def test_ragged_sass_holds_grouped_block_scaled_tcgen05_mma(kernel_sass):
    (sass,) = kernel_sass("sm_100a", r"GemmUniversal.*MainloopSm100ArrayTmaUmmaWarpSpecializedBlockScaled").values()
    assert re.search(r"\bUTCOMMA\.4X\b", sass)  # kind::mxf4nvf4, scale_vec::4X, 1-SM
    assert re.search(r"\bUTCCP\.T\.S\.4x32dp128bit\b", sass)  # scales -> TMEM
    assert re.search(r"\bUTMALDG\.[345]D\b", sass)
    helpers = kernel_sass("sm_100a", r"ragged_setup_kernel|regroup_scales_kernel|ragged_output_kernel")
    assert len(helpers) == 3, sorted(helpers)


@pytest.mark.parametrize("w4a4", [True, False])
def test_blackwell_ragged_matmul_matches_reference(blackwell, w4a4):
    m, groups, n, k = 300, 5, 208, 256
    sizes = jnp.array([100, 0, 3, 130, 40], jnp.int32)  # 27 rows of no group
    with jax.default_device(blackwell):
        x = mc.random_float((m, k), jnp.bfloat16, seed=31)
        w = jax.vmap(jn.quantize)(jnp.stack([mc.random_float((n, k), jnp.float32, seed=40 + g)
                                              for g in range(groups)]))
        xq = jn.quantize(x)
        y = jn.ragged_matmul(xq if w4a4 else x, w, sizes, out_dtype=jnp.float32)
        # W4A16 quantizes x on the device with the library's exact recipe, as matmul does.
        with jax.default_device(jax.devices("cpu")[0]):
            want = jn.ragged_matmul(xq, w, sizes, out_dtype=jnp.float32)
    mc.assert_close(y, np.asarray(want, np.float64), 1e-5)
