"""The sm_100a shifted-operand convolution: its schedule, checked by the host TMEM model, and
its SASS. No Blackwell GPU exists here, so nothing in this file runs the kernel."""

import re
from collections import Counter
from pathlib import Path

import pytest

MODEL = Path(__file__).resolve().parent / "host" / "conv_sm100_model.cc"

# (N, H, W, C, K, R, S, stride_h, stride_w, pad_top, pad_bottom, pad_left, pad_right, dil_h, dil_w)
CASES = {
    "3x3_same_resnet_stage4": (3, 7, 7, 3, 4, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1),
    "3x3_same_many_tiles": (2, 14, 14, 2, 3, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1),
    "5x5_stride2_asymmetric_pad": (2, 9, 11, 2, 3, 5, 5, 2, 2, 2, 1, 2, 1, 1, 1),
    "7x7_stride2_stem": (1, 40, 40, 2, 2, 7, 7, 2, 2, 3, 3, 3, 3, 1, 1),
    "3x3_dilation2": (2, 9, 11, 2, 3, 3, 3, 1, 1, 2, 2, 2, 2, 2, 2),
    "7x7_dilation3_wide_span": (1, 12, 30, 1, 2, 7, 7, 1, 1, 9, 9, 9, 9, 3, 3),
    "3x3_valid_no_padding": (2, 9, 13, 2, 3, 3, 3, 1, 1, 0, 0, 0, 0, 1, 1),
    "3x3_padding_wider_than_filter": (2, 5, 4, 2, 2, 3, 3, 1, 1, 3, 2, 3, 2, 1, 1),
    "1x1": (2, 6, 6, 3, 5, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1),
    "1x1_stride2": (3, 7, 7, 2, 2, 1, 1, 2, 2, 0, 0, 0, 0, 1, 1),
    "1x7_then_7x1": (2, 8, 9, 2, 2, 1, 7, 1, 1, 0, 0, 3, 3, 1, 1),
    "7x1": (2, 9, 8, 2, 2, 7, 1, 1, 1, 3, 3, 0, 0, 1, 1),
    "5x5_stride3_dilation2": (2, 17, 19, 2, 2, 5, 5, 3, 3, 4, 4, 4, 4, 2, 2),
    "3x3_stride2_one_pixel_wide": (4, 5, 1, 2, 2, 3, 3, 2, 2, 1, 1, 1, 1, 1, 1),
    "single_image_width_1_output": (1, 3, 3, 2, 2, 3, 3, 1, 1, 0, 0, 0, 0, 1, 1),
}


def run_model(host_program, case, mode="ok"):
    out = host_program(MODEL, args=(*case, mode))
    stats = Counter()
    result = None
    for line in out.splitlines():
        parts = line.split()
        if parts[0] == "stat":
            stats[parts[1]] = int(parts[2])
        elif parts[0] == "result":
            result = parts[1]
    return result, stats


@pytest.mark.parametrize("name", sorted(CASES))
def test_schedule_matches_direct_convolution(host_program, name):
    result, stats = run_model(host_program, CASES[name])
    assert result == "ok", (name, dict(stats))
    assert stats["missing_outputs"] == 0 and stats["repeated_outputs"] == 0
    assert stats["span"] < 32


def test_cases_exercise_every_mask_and_halo_branch(host_program):
    total = Counter()
    for case in CASES.values():
        total.update(run_model(host_program, case)[1])
    # Windows of 32 lanes that cross into the next output row or image (the halo).
    assert total["halo_windows"] > 0
    # Padding taps masked where the lane holds the neighbouring row's real pixel...
    assert total["masked_wrapped_pixel"] > 0
    # ...or no pixel at all, and rows that fall into the vertical padding.
    assert total["masked_empty_lane"] > 0
    assert total["masked_vertical_padding"] > 0
    # Lanes without an output (the first `span` lanes of each sub-partition, row gaps).
    assert total["masked_invalid_output"] > 0
    # Dilation: steps with no tap that only shift.
    assert total["shift_only_steps"] > 0
    assert total["shifts"] > 0 and total["lanes_without_pixel"] > 0
    assert max(run_model(host_program, c)[1]["tiles"] for c in CASES.values()) > 4


def test_schedule_holds_if_the_shift_crossed_sub_partitions(host_program):
    # The schedule never reads a lane that a cross-partition shift would fill differently.
    for name in ("3x3_same_resnet_stage4", "5x5_stride2_asymmetric_pad", "3x3_dilation2"):
        assert run_model(host_program, CASES[name], "hw-shift-128")[0] == "ok", name


@pytest.mark.parametrize("fault", ["no-mask", "forward-taps", "shift-128"])
def test_model_catches_a_broken_schedule(host_program, fault):
    result, stats = run_model(host_program, CASES["3x3_same_resnet_stage4"], fault)
    assert result == "mismatch", fault
    assert stats["bad_values"] > 0


def test_filter_too_wide_for_a_sub_partition_is_unsupported(host_program):
    # span = (11 - 1) * 4 = 40 shifts: no lane of a 32-lane sub-partition survives.
    case = (1, 60, 60, 1, 1, 11, 11, 1, 1, 20, 20, 20, 20, 4, 4)
    assert run_model(host_program, case)[0] == "unsupported"


KERNEL = r"conv_sm100_ashift_kernel"


def _mma_lines(sass):
    return [l for l in sass.splitlines() if "UTCHMMA" in l or "UTCOMMA" in l]


def test_sass_has_the_ashift_mma(kernel_sass):
    for name, sass in kernel_sass("sm_100a", KERNEL).items():
        mmas = _mma_lines(sass)
        # kind::f16 with A in TMEM and .ashift: UTCHMMA.ASHIFT tmem[D], gdesc[B], tmem[A], ...
        shifted = [l for l in mmas if re.search(r"\bUTCHMMA\.ASHIFT tmem\[UR\w+\], gdesc\[", l)]
        assert shifted, name
        # The last tap of a chain does not shift.
        assert any(re.search(r"\bUTCHMMA tmem\[", l) for l in mmas), name
        # The disable-output-lane mask is a live uniform register after idesc (ptxas prints
        # nothing there for an all-zero mask).
        assert all(re.search(r"idesc\[UR\w+\], UR\d+,", l) for l in shifted), name
        # Not a block-scaled MMA: .ashift is only legal without block scaling.
        assert not any("UTCOMMA" in l for l in mmas), name
        assert "UTCBAR" in sass, name  # tcgen05.commit to the mbarrier
