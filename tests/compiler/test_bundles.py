"""The VLIW bundle reader on a hand-written schedule (no libtpu needed)."""

from perfmodel.compiler.bundles import build_schedule, grid_loop, loop_body_text, loop_stats, xlu_issue

from tests.compiler.schedules import PIPELINED

# A 3-iteration grid loop (bundles 0x1..0x9) holding: a guard branch over most of the body is absent; a
# predicated region (0x3..0x4, skipped when %p0) and an inner loop (0x5..0x6) of 4 trips; one DMA start,
# one wait, one bounds-check halt, one scalar spill and fill.
SCHEDULE = """\
     0   :  { %s1 = smov 0 } /* Start region 1 */
   0x1 LB: > { %s2 = sphi %s1, %s9  ;;  %10 = dma.hbm_to_vmem [thread:$0]  %s3, 64, %s4, %s5 /*
base_bounds: (8, 1)
 */ } /* Start region 7 */
   0x2   : > { %p0 = scmp.ne.s32.totalorder %s2, 0  ;;  %11 = sbr.rel (%p0) target = $region9 }
   0x3   : > { %v1 = vld [vmem:[#allocation2] sm:$0xff]  ;;  %12 = sst [smem:[#allocation5_spill]] %s2 }
   0x4   : > { %13 = vst [vmem:[#allocation3] sm:$0xff] %v1 }
   0x5 LB: >> { %s6 = sphi %s1, %s7  ;;  %s7 = sadd.s32 1, %s6 } /* Start/End empty region 9 :: Start region 11 */
   0x6   : >> { %p8 = scmp.ge.s32.totalorder %s7, 4 /* loop exit test */  ;;  %14 = sbr.rel (!%p8) target = $region11 }
   0x7   : > { %15 = dma.done.wait %s5, 64  ;;  %16 = shalt.err (!%p8) }
   0x8   : > { %s9 = sadd.s32 1, %s2  ;;  %s17 = sld [smem:[#allocation5_spill]] }
   0x9   : > { %p18 = scmp.ge.s32.totalorder %s9, 3 /* loop exit test */  ;;  %19 = sbr.rel (!%p18) target = $region7 }
   0xa   :  { %20 = vsyncpa [#allocation4], 1 }
"""

UTILIZATION = """\
== CAPACTIY:
MXU, VALU, VLOAD, VLOAD:FILL, VSTORE, VSTORE:SPILL, SALU
    4     4     3     3     1     1     2
== UTILIZATION:
0 0 0 0 0 0 1
0 0 0 0 0 0 1
0 0 0 0 0 0 1
0 0 1 1 0 0 1
0 0 0 0 1 1 0
0 0 0 0 0 0 2
0 0 0 0 0 0 1
0 0 0 0 0 0 0
0 0 0 0 0 0 2
0 0 0 0 0 0 1
0 0 0 0 0 0 0
"""


def test_loops_regions_and_counts():
    sched = build_schedule(SCHEDULE, UTILIZATION)
    assert len(sched.bundles) == 11
    assert [(lp.start, lp.end, lp.trip_count) for lp in sched.loops] == [(5, 6, 4), (1, 9, 3)]
    loop = grid_loop(sched)
    assert (loop.start, loop.end, loop.trip_count) == (1, 9, 3)
    st = loop_stats(sched, loop)
    # 9 static bundles 0x1..0x9; the inner loop's 2 bundles run 4 times: 9 - 2 + 2*4 = 15 per iteration.
    assert st.bundles == 9 and st.weighted_bundles == 15
    # The branch at 0x2 skips 0x3..0x4 (2 bundles) when %p0: predicated; the rest (13) runs every step.
    assert st.predicated_regions == (2,) and st.predicated_bundles == 2 and st.always_bundles == 13
    assert st.inner_loops == 1 and st.inner_loops_unknown_trips == 0
    assert (st.dma_starts, st.dma_waits, st.bounds_check_halts) == (1, 1, 1)
    assert (st.scalar_spills, st.scalar_fills) == (1, 1)
    # Vector spill/fill columns: one each at 0x4 / 0x3.
    assert (st.vector_spills, st.vector_fills) == (1, 1)
    # SALU: rows 0x1..0x9 weighted (inner rows x4): 1+1+1+0 + 4*(2+1) + 0+2+1 = 18 of 2 slots x 15 bundles.
    assert abs(st.slot_utilization["SALU"] - 18 / 30) < 1e-9
    assert "LB:" in loop_body_text(sched, loop).splitlines()[0]


GUARDED = """\
   0x1 LB: > { %s2 = sphi %s1, %s9 } /* Start region 7 */
   0x2   : > { %11 = sbr.rel (%p0) target = $region9 }
   0x3   : > { %s3 = sadd.s32 1, %s2 }
   0x4   : > { %s4 = sadd.s32 1, %s3 }
   0x5   : > { %s5 = sadd.s32 1, %s4 }
   0x6   : > { %s6 = sadd.s32 1, %s5 }
   0x7   : > { %s7 = sadd.s32 1, %s6 }
   0x8   : > { %s8 = sadd.s32 1, %s7 }
   0x9   : > { %s9 = sadd.s32 1, %s2 ;;  %p18 = scmp.ge.s32.totalorder %s9, 10 /* loop exit test */ } /* Start region 9 */
   0xa   : > { %19 = sbr.rel (!%p18) target = $region7 }
"""


def test_guard_region_is_not_predicated():
    # The branch at 0x2 skips 0x3..0x8: 6 of the 10 body bundles is under GUARD_SHARE (0.75): predicated.
    sched = build_schedule(GUARDED)
    st = loop_stats(sched, grid_loop(sched))
    assert st.predicated_bundles == 6 and st.guarded_bundles == 0
    # Three more bundles under the branch make it 9 of 13 (69%): still predicated; six more, 12 of 16 (75%): a guard.
    more = GUARDED.replace("   0x9   :", "".join(f"   0x8{i}  : > {{ %t{i} = sadd.s32 1, %s8 }}\n" for i in range(6))
                           + "   0x9   :")
    sched = build_schedule(more)
    st = loop_stats(sched, grid_loop(sched))
    assert st.bundles == 16 and st.guarded_bundles == 12 and st.predicated_bundles == 0 and st.always_bundles == 16
    assert st.trip_count == 10


def test_no_loop_means_whole_program():
    sched = build_schedule("     0   :  { %s1 = smov 0 }\n   0x1   :  { %2 = vsyncpa [#allocation4], 1 }\n")
    assert grid_loop(sched) is None
    st = loop_stats(sched, None)
    assert st.bundles == 2 and st.trip_count == 1 and st.predicated_bundles == 0


def test_data_dependent_trip_count_is_none():
    text = SCHEDULE.replace("%s7, 4 /* loop exit test */", "%s7, %s30 /* loop exit test */")
    # Seen from outside every loop, the inner loop's unknown trip count is counted once, the outer one 3 times.
    sched = build_schedule(text)
    assert sched.loops[0].trip_count is None
    st = loop_stats(sched, grid_loop(sched))
    assert st.inner_loops_unknown_trips == 1 and st.weighted_bundles == 9


def test_pipelined_loop_guard_runs_past_fill_and_drain():
    sched = build_schedule(PIPELINED)
    (loop,) = sched.loops
    # 8 trips of a 3-stage pipeline: 6 work items, the first 2 iterations fill it (the guard skips them).
    assert (loop.trip_count, loop.stages, loop.guarded_trips()) == (8, 2, 6)
    # Seen from outside: the 4 unguarded bundles run 8 times, the 12 guarded ones 6 times: 4*8 + 12*6 = 104.
    assert loop_stats(sched, None).weighted_bundles == 104
    # Each XLU takes one push per work item (the vpops are results taken back, not pushes).
    assert xlu_issue(sched).pushes == {0: 6, 1: 6}
    # Without the compiler's stage notes the loop is not pipelined: every trip runs everything (16 x 8).
    plain = build_schedule(PIPELINED.replace("iteration index, stage = 2", "iteration index"))
    assert plain.loops[0].stages == 0 and loop_stats(plain, None).weighted_bundles == 128
    assert xlu_issue(plain).pushes == {0: 8, 1: 8}
    # Per iteration (the loop as a grid loop) nothing changes: 16 bundles, the guard not predicated.
    st = loop_stats(sched, loop)
    assert st.weighted_bundles == 16 and st.guarded_bundles == 12 and st.predicated_bundles == 0


def test_pipelined_grid_loop_stats_count_its_runs_as_the_whole_program_does():
    # The same loop read as a grid loop (a Pallas call's): its 8 trips issue what the whole-program count sees,
    # 4 x 8 + 12 x 6 = 104 bundles; with fewer trips than stages every trip runs the guard (16 x 1).
    sched = build_schedule(PIPELINED)
    st = loop_stats(sched, sched.loops[0])
    assert (st.stages, st.guarded_weighted_bundles) == (2, 12)
    assert st.run_bundles(8) == loop_stats(sched, None).weighted_bundles == 104
    assert st.run_bundles(1) == 16
    plain = build_schedule(PIPELINED.replace("iteration index, stage = 2", "iteration index"))
    st = loop_stats(plain, plain.loops[0])
    assert (st.stages, st.guarded_weighted_bundles, st.run_bundles(8)) == (0, 0, 128)
