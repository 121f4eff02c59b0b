"""Which predicated regions of a compiled loop body can run in one iteration (hand-written schedules, no libtpu)."""

import pytest

from perfmodel.compiler import predicates
from perfmodel.compiler.bundles import build_schedule, grid_loop, loop_stats
from perfmodel.compiler.predicates import definitions, most_run

# A grid loop shaped like tokamax's splash attention backward (libtpu 0.0.42.1): %s6 is the block's mask kind
# (0 empty, 1 partial, 2 full). Region 21 (0x4..0x6, 3 bundles) zeroes the accumulator on the first kv step
# (skipped when %s3 != 0); region 23 (0x9..0xb with 0xa2, 4 bundles) is the unmasked path, skipped when
# %p7 = nand(%s6 != 0, %s6 != 1), i.e. it runs only when the kind is 2; region 25 (0xe..0x10, 3 bundles) is the
# masked path, skipped when %p1 = nand(%s12 == 1, %s6 != 0) with %s12 a copy of %s6: it runs only when the kind is 1.
SPLASH = """\
   0x1 LB: > { %s3 = sphi %s0, %s30  ;;  %s6 = sld [smem:[#allocation9]] } /* Start region 7 */
   0x2   : > { %s12 = smov %s6  ;;  %p2 = scmp.ne.s32.totalorder %s3, 0 }
   0x3   : > { %5 = sbr.rel (%p2) target = $region22 }
   0x4   : > { %v1 = vld [vmem:[#allocation2] sm:$0xff] } /* Start region 21 */
   0x5   : > { %v2 = vadd.f32 %v1, %v1 }
   0x6   : > { %6 = vst [vmem:[#allocation3] sm:$0xff] %v2 } /* End region 21 */
   0x7   : > { %p4 = scmp.ne.s32.totalorder %s6, 0  ;;  %p5 = scmp.ne.s32.totalorder %s6, 1  ;;  %p7 = pnand %p4, %p5 } /* Start/End empty region 22 */
   0x8   : > { %8 = sbr.rel (%p7) target = $region24 }
   0x9   : > { %v3 = vld [vmem:[#allocation2] sm:$0xff] } /* Start region 23 */
   0xa   : > { %v4 = vmul.f32 %v3, %v3 }
   0xa2  : > { %v7 = vmul.f32 %v4, %v3 }
   0xb   : > { %9 = vst [vmem:[#allocation3] sm:$0xff] %v4 } /* End region 23 */
   0xc   : > { %p11 = scmp.eq.s32.totalorder %s12, 1  ;;  %p1 = pnand %p11, %p4 } /* Start/End empty region 24 */
   0xd   : > { %13 = sbr.rel (%p1) target = $region26 }
   0xe   : > { %v5 = vld [vmem:[#allocation2] sm:$0xff] } /* Start region 25 */
   0xf   : > { %v6 = vsel %v5, %v5 }
   0x10  : > { %14 = vst [vmem:[#allocation3] sm:$0xff] %v6 } /* End region 25 */
   0x11  : > { %s30 = sadd.s32 1, %s3 } /* Start/End empty region 26 */
   0x12  : > { %p18 = scmp.ge.s32.totalorder %s30, 16 /* loop exit test */ }
   0x13  : > { %19 = sbr.rel (!%p18) target = $region7 }
"""


def test_masked_and_unmasked_paths_exclude_each_other():
    st = loop_stats(sched := build_schedule(SPLASH), grid_loop(sched))
    # Regions: 0x4..0x6 (the branch at 0x3 jumps to region 22's start, 0x7), 0x9..0xb (with 0xa2: 4), 0xe..0x10.
    assert st.predicated_regions == (3, 4, 3) and st.predicated_bundles == 10
    # The first-step region can run with either path, never both paths: 3 + max(4, 3) = 7.
    assert st.predicated_max_bundles == 7


def test_independent_conditions_all_run():
    # With the masked path keyed on an unrelated scalar (%s40) nothing excludes anything: all 10 bundles.
    text = SPLASH.replace("%p11 = scmp.eq.s32.totalorder %s12, 1  ;;  %p1 = pnand %p11, %p4",
                          "%p11 = scmp.eq.s32.totalorder %s40, 1  ;;  %p1 = pnand %p11, %p11")
    st = loop_stats(sched := build_schedule(text), grid_loop(sched))
    assert st.predicated_max_bundles == st.predicated_bundles == 10


def test_undefined_and_unconditional_branches_are_free():
    # (bundles, (negated, predicate) or None): %p9 has no definition and the None branch is unconditional.
    assert most_run([(5, (False, "%p9")), (7, None)], []) == 12
    # The same predicate skipping one region and guarding the other: exactly one of them runs.
    assert most_run([(5, (False, "%p9")), (7, (True, "%p9"))], []) == 7


@pytest.mark.parametrize("cond, imms, both", [
    # %s1 < 4 and %s1 >= 4 never hold together; %s1 < 4 and %s1 > 2 do at 3.
    ("lt", ("ge", 4), False), ("lt", ("gt", 2), True),
    # unsigned: -1 is 2**32 - 1, not below 4.
    ("ltu", ("eq", -1), False),
])
def test_ordered_compares(cond, imms, both):
    width = "u32" if cond.endswith("u") else "s32"
    texts = [f"{{ %p1 = scmp.{cond.rstrip('u')}.{width}.totalorder %s1, 4 }}",
             f"{{ %p2 = scmp.{imms[0]}.{width}.totalorder %s1, {imms[1]} }}"]
    # Each region runs when its predicate holds (negated branch).
    got = most_run([(2, (True, "%p1")), (3, (True, "%p2"))], texts)
    assert got == (5 if both else 3)


def test_too_many_assignments_counts_every_region(monkeypatch):
    monkeypatch.setattr(predicates, "MAX_ASSIGNMENTS", 2)
    st = loop_stats(sched := build_schedule(SPLASH), grid_loop(sched))
    assert st.predicated_max_bundles == st.predicated_bundles == 10


def test_definitions_twice_defined_register_is_unknown():
    defs = definitions(["{ %p1 = pneg %p2 ;; %s3 = smov 4 }", "{ %p1 = pmov %p5 }"])
    assert defs["%p1"] == ("", ()) and defs["%s3"] == ("smov", ("4",))


@pytest.mark.parametrize("exclusive", [True, False])
def test_report_names_the_most_one_step_runs_only_when_paths_exclude(exclusive):
    from types import SimpleNamespace

    from perfmodel.compiler.render import render_report

    text = SPLASH if exclusive else SPLASH.replace("%p11 = scmp.eq.s32.totalorder %s12, 1  ;;  %p1 = pnand %p11, %p4",
                                                   "%p11 = scmp.eq.s32.totalorder %s40, 1  ;;  %p1 = pnand %p11, %p11")
    loop = loop_stats(sched := build_schedule(text), grid_loop(sched))
    kernel = SimpleNamespace(hlo_name="k.1", program_bundles=20, mxus=0, scoped_vmem_bytes=None, loop=loop,
                             has_grid_loop=True)
    report = SimpleNamespace(call="k", chip="tpu-7x", topology="tpu7x:2x2x1", device_kind="TPU7x",
                             libtpu_version="0", jax_version="0", compiled=True, from_cache=True, kernels=[kernel],
                             other_ops=())
    out = render_report(report)
    assert "predicated: 10 (regions of 3, 4, 3 bundles" in out
    assert ("at most 7 in one step" in out) is exclusive


def test_report_says_how_many_grid_iterations_only_fill_or_drain_the_pipeline():
    from types import SimpleNamespace

    from perfmodel.compiler.render import render_report
    from tests.compiler.schedules import PIPELINED

    sched = build_schedule(PIPELINED)
    kernel = SimpleNamespace(hlo_name="k.1", program_bundles=20, mxus=0, scoped_vmem_bytes=None, has_grid_loop=True,
                             loop=loop_stats(sched, sched.loops[0]))
    report = SimpleNamespace(call="k", chip="tpu-7x", topology="tpu7x:2x2x1", device_kind="TPU7x",
                             libtpu_version="0", jax_version="0", compiled=True, from_cache=True, kernels=[kernel],
                             other_ops=())
    # 8 trips, stage notes up to 2: 6 run the 12-bundle step guard, 2 only fill or drain
    assert ("software-pipelined 3 stages deep: 6 iterations run the step guard's 12 bundles, 2 only fill or drain"
            in render_report(report))
