"""perfmodel.xla without the compiler: HLO parsing and counting, per-op times, the step comparison, CLI errors."""

from types import SimpleNamespace

import pytest
from click.testing import CliRunner

from perfmodel.cli.main import main
from perfmodel.errors import InputError
from perfmodel.hw.registry import get_chip
from perfmodel.xla import hlo
from perfmodel.xla.program import build_program, scope_of

# A while loop of 3 trips whose body runs a matmul fusion reading one layer of stacked weights (dynamic-slice),
# an in-place cache update and an all-reduce over 4 chips; the entry prefetches an array into VMEM (S(1)).
HLO = """HloModule jit_step

%fused_dot (p0: bf16[3,256,512], p1: s32[], p2: bf16[8,256]) -> bf16[8,512] {
  %p0 = bf16[3,256,512]{2,1,0} parameter(0)
  %p1 = s32[] parameter(1)
  %z = s32[] constant(0)
  %ds = bf16[1,256,512]{2,1,0} dynamic-slice(%p0, %p1, %z, %z), dynamic_slice_sizes={1,256,512}
  %w = bf16[256,512]{1,0} bitcast(%ds)
  %p2 = bf16[8,256]{1,0} parameter(2)
  ROOT %d = bf16[8,512]{1,0} dot(%p2, %w), lhs_contracting_dims={1}, rhs_contracting_dims={0}, metadata={op_name="jit(step)/while/body/qkv_proj/dot_general"}
}

%fused_dus (q0: bf16[3,64,512], q1: bf16[1,8,512], q2: s32[]) -> bf16[3,64,512] {
  %q0 = bf16[3,64,512]{2,1,0} parameter(0)
  %q1 = bf16[1,8,512]{2,1,0} parameter(1)
  %q2 = s32[] parameter(2)
  %zz = s32[] constant(0)
  ROOT %u = bf16[3,64,512]{2,1,0} dynamic-update-slice(%q0, %q1, %q2, %zz, %zz), metadata={op_name="jit(step)/while/body/kv_write/dynamic_update_slice"}
}

%add (a: bf16[], b: bf16[]) -> bf16[] {
  %a = bf16[] parameter(0)
  %b = bf16[] parameter(1)
  ROOT %s = bf16[] add(%a, %b)
}

%body (t: (s32[], bf16[8,256], bf16[3,256,512], bf16[3,64,512])) -> (s32[], bf16[8,256], bf16[3,256,512], bf16[3,64,512]) {
  %t = (s32[], bf16[8,256]{1,0}, bf16[3,256,512]{2,1,0}, bf16[3,64,512]{2,1,0}) parameter(0)
  %i = s32[] get-tuple-element(%t), index=0
  %x = bf16[8,256]{1,0} get-tuple-element(%t), index=1
  %w = bf16[3,256,512]{2,1,0} get-tuple-element(%t), index=2
  %c = bf16[3,64,512]{2,1,0} get-tuple-element(%t), index=3
  %fusion.1 = bf16[8,512]{1,0} fusion(%w, %i, %x), kind=kOutput, calls=%fused_dot, metadata={op_name="jit(step)/while/body/qkv_proj/dot_general"}
  %r = bf16[1,8,512]{2,1,0} bitcast(%fusion.1)
  %fusion.2 = bf16[3,64,512]{2,1,0} fusion(%c, %r, %i), kind=kLoop, calls=%fused_dus, metadata={op_name="jit(step)/while/body/kv_write/dynamic_update_slice"}
  %all-reduce.1 = bf16[8,512]{1,0} all-reduce(%fusion.1), channel_id=1, replica_groups={{0,1,2,3}}, to_apply=%add
  %one = s32[] constant(1)
  %n = s32[] add(%i, %one)
  ROOT %tt = (s32[], bf16[8,256]{1,0}, bf16[3,256,512]{2,1,0}, bf16[3,64,512]{2,1,0}) tuple(%n, %x, %w, %fusion.2)
}

%cond (t: (s32[], bf16[8,256], bf16[3,256,512], bf16[3,64,512])) -> pred[] {
  %t = (s32[], bf16[8,256]{1,0}, bf16[3,256,512]{2,1,0}, bf16[3,64,512]{2,1,0}) parameter(0)
  %i = s32[] get-tuple-element(%t), index=0
  %k = s32[] constant(3)
  ROOT %lt = pred[] compare(%i, %k), direction=LT
}

ENTRY %main (x: bf16[8,256], w: bf16[3,256,512], c: bf16[3,64,512]) -> bf16[3,64,512] {
  %x = bf16[8,256]{1,0} parameter(0)
  %w = bf16[3,256,512]{2,1,0} parameter(1)
  %c = bf16[3,64,512]{2,1,0} parameter(2)
  %copy-start = (bf16[8,256]{1,0:S(1)}, bf16[8,256]{1,0}, u32[]) copy-start(%x)
  %copy-done = bf16[8,256]{1,0:S(1)} copy-done(%copy-start)
  %zero = s32[] constant(0)
  %init = (s32[], bf16[8,256]{1,0}, bf16[3,256,512]{2,1,0}, bf16[3,64,512]{2,1,0}) tuple(%zero, %copy-done, %w, %c)
  %while.1 = (s32[], bf16[8,256]{1,0}, bf16[3,256,512]{2,1,0}, bf16[3,64,512]{2,1,0}) while(%init), condition=%cond, body=%body
  ROOT %out = bf16[3,64,512]{2,1,0} get-tuple-element(%while.1), index=3
}
"""


def _work(name: str) -> hlo.Work:
    comps = hlo.parse_module(HLO)
    body = comps["body"]
    ins = body.by_name()[name]
    return hlo.instruction_work(comps, ins, {i.name: i.arrays for i in body.instructions})


def test_parse_and_trip_count():
    comps = hlo.parse_module(HLO)
    main_ = hlo.entry(comps)
    assert main_.name == "main"
    loop = main_.by_name()["while.1"]
    assert hlo.while_trip_count(comps, loop) == 3
    assert hlo.collective_group_size(comps["body"].by_name()["all-reduce.1"], default=1) == 4
    cs = main_.by_name()["copy-start"]
    assert [a.memory_space for a in cs.arrays] == [1, 0, 0]


def test_dot_fusion_reads_one_layer_of_the_stack():
    w = _work("fusion.1")
    assert w.flops == 2 * 8 * 512 * 256  # 2 x out elements x K
    # reads x (8x256 bf16 = 4096 B), one layer of w (256x512x2 = 262144 B) and the layer index (4 B),
    # writes 8x512x2 = 8192 B
    assert w.bytes == 4096 + 262144 + 4 + 8192
    assert w.hbm_bytes == w.bytes  # nothing in VMEM


def test_in_place_update_counts_the_update_not_the_buffer():
    w = _work("fusion.2")
    # the 3x64x512 cache is updated in place: read the 8x512 update (8192 B) + the index (4 B), write 8192 B
    assert w.bytes == 8192 + 4 + 8192


def test_async_copy_into_vmem_reads_hbm_only():
    comps = hlo.parse_module(HLO)
    main_ = hlo.entry(comps)
    w = hlo.instruction_work(comps, main_.by_name()["copy-start"], {i.name: i.arrays for i in main_.instructions})
    assert (w.bytes, w.hbm_bytes) == (2 * 4096, 4096)  # read 4 kB from HBM, write them to VMEM


def _report(bundles: dict[str, int]) -> SimpleNamespace:
    return SimpleNamespace(compiled=True, call="step", error=None, hlo_path=None, kernels=(), topology="v5e:2x2",
                           chips=4, cost_analysis={}, memory={"argument_size_in_bytes": 1000,
                                                              "output_size_in_bytes": 600, "alias_size_in_bytes": 600,
                                                              "temp_size_in_bytes": 50,
                                                              "generated_code_size_in_bytes": 10},
                           compile_s=1.0, from_cache=True,
                           other_ops=tuple({"hlo_name": k, "program_bundles": v, "weighted_bundles": v}
                                           for k, v in bundles.items()))


def test_program_times_ops_per_trip():
    from perfmodel.model.core import ACHIEVABLE
    from perfmodel.schedule.compiled import default_constants

    chip = get_chip("v5e")
    p = build_program(_report({"fusion.1": 30_000, "fusion.2": 10}), chip, hlo_text=HLO)
    names = {o.hlo_name: o for o in p.ops}
    assert set(names) == {"fusion.1", "fusion.2", "all-reduce.1", "copy-start"}
    dot = names["fusion.1"]
    assert dot.count == 3 and dot.kind == "matmul"
    assert dot.compute_s == pytest.approx(default_constants().stall_factor * 30_000 / chip.compute.clock_hz)
    assert dot.memory_s == pytest.approx(dot.hbm_bytes / (chip.memory.hbm_bw_bytes_per_s_per_chip *
                                                          ACHIEVABLE["hbm"][0]))
    assert dot.bound == "compute" and dot.time_s == dot.compute_s  # 30k bundles at 1.5 GHz >> 275 kB of HBM
    ar = names["all-reduce.1"]
    assert ar.kind == "collective" and ar.group_chips == 4 and ar.bound == "ici"
    # the collective inherits its operand's name stack (the partitioner's collectives carry none)
    assert scope_of(ar.op_name, {"qkv_proj"}) == "qkv_proj"
    assert p.step_s == pytest.approx(sum(o.count * o.time_s for o in p.ops))
    assert p.hbm_footprint_bytes == 1000 + 600 - 600 + 50 + 10


def test_program_hbm_runs_at_the_chips_fitted_share():
    # One 7x TensorCore (tpu-7x/core) has a fitted HBM share in efficiency.yaml (0.59); the whole chip keeps
    # ACHIEVABLE's. The same program's HBM-bound op takes longer on the core by the ratio of the two shares.
    from perfmodel.model.core import ACHIEVABLE
    from perfmodel.model.efficiency import chip_efficiency

    core, whole = get_chip("tpu-7x/core"), get_chip("tpu-7x")
    share = chip_efficiency("tpu-7x/core").hbm_share
    assert share < ACHIEVABLE["hbm"][0]
    ops = {}
    for chip in (core, whole):
        p = build_program(_report({"fusion.1": 10, "fusion.2": 10}), chip, hlo_text=HLO)
        ops[chip.name] = {o.hlo_name: o for o in p.ops}["fusion.2"]
    assert ops["tpu-7x/core"].memory_s == pytest.approx(
        ops["tpu-7x/core"].hbm_bytes / (core.memory.hbm_bw_bytes_per_s_per_chip * share))
    assert ops["tpu-7x"].memory_s == pytest.approx(
        ops["tpu-7x"].hbm_bytes / (whole.memory.hbm_bw_bytes_per_s_per_chip * ACHIEVABLE["hbm"][0]))


@pytest.mark.parametrize("chip_name, floored", [("tpu-7x/core", True), ("tpu-v5e", True), ("tpu-v6e", False)])
def test_an_ops_flops_take_at_least_their_time_at_the_fitted_xla_mxu_share(chip_name, floored):
    # The matmul fusion does 2 x 8 x 256 x 512 = 2.10 MFLOP per trip. With one bundle (0.45-0.67 ns at the
    # clock) its compute is its FLOPs at the fitted bf16 share where efficiency.yaml has one (one 7x core:
    # 0.74 of 1.15 PFLOP/s = 2.5 ns; v5e: 0.95 of 197 TFLOP/s = 11.2 ns); v6e has none: the bundle alone.
    from perfmodel.model.efficiency import chip_efficiency
    from perfmodel.schedule.compiled import default_constants

    chip = get_chip(chip_name)
    dot = {o.hlo_name: o for o in build_program(_report({"fusion.1": 1, "fusion.2": 10}), chip,
                                                hlo_text=HLO).ops}["fusion.1"]
    assert dot.flops == 2 * 8 * 256 * 512
    bundle_s = default_constants().stall_factor / chip.compute.clock_hz
    if floored:
        share = chip_efficiency(chip.name).mxu_share["bf16"]
        want = dot.flops / (chip.compute.matmul_flops_per_s_per_chip["bf16"] * share)
        assert want > bundle_s and dot.compute_s == pytest.approx(want)
    else:
        assert "bf16" not in chip_efficiency(chip.name).mxu_share
        assert dot.compute_s == pytest.approx(bundle_s)


def test_compare_maps_ops_by_scope_and_flags_gaps():
    from perfmodel.model.configs import get_model
    from perfmodel.model.step import make_step
    from perfmodel.model.transformer import predict_step
    from perfmodel.xla.compare import compare

    chip = get_chip("v5e")
    cfg = get_model("tests/xla/data/tiny-llama.json")
    pred = predict_step(cfg, make_step(batch=8, context=64, tp=4), chip)
    p = build_program(_report({"fusion.1": 30_000, "fusion.2": 10}), chip, hlo_text=HLO)
    c = compare(pred, p)
    rows = {r.name: r for r in c.rows}
    assert rows["qkv_proj"].hlo_ops == ("fusion.1",)
    assert rows["kv_write"].hlo_ops == ("fusion.2",)
    assert rows["all_reduce(attn)"].hlo_ops == ("all-reduce.1",)  # the qkv_proj scope is in the attention block
    assert rows["(prefetch DMAs)"].analytic_s is None and rows["(prefetch DMAs)"].flagged
    assert rows["swiglu"].compiled_s == 0 and "no compiled op" in rows["swiglu"].reasons[0]
    q = rows["qkv_proj"]
    assert q.flagged == (abs(q.compiled_s / q.analytic_s - 1) > 0.15)
    assert c.compiled_s == pytest.approx(p.step_s)


def test_topology_check():
    from perfmodel.compiler.toolchain import check_topology, topology_chips

    assert check_topology("tpu-v5e", "v5e:2x4") == "v5e:2x4" and topology_chips("v5e:2x4") == 8
    assert check_topology("tpu-v5e", None) == "v5e:2x2"
    with pytest.raises(InputError, match=r"`topology` 'v6e:2x2': tpu-v5e slices are written like 'v5e:2x2'"):
        check_topology("tpu-v5e", "v6e:2x2")
    with pytest.raises(InputError, match="`topology` 'v5p:2x2'"):
        check_topology("tpu-v5p", "v5p:2x2")  # v5p slices have three axes


def test_default_topology_grows_to_tp():
    from perfmodel.xla.compare import default_topology

    assert default_topology(get_chip("v5e"), 4) is None
    assert default_topology(get_chip("v5e"), 8) == "v5e:4x2"


def test_cli_errors_name_flags():
    r = CliRunner().invoke(main, ["xla", "kernels.matmul.kernel:matmul", "--shape", "x=8x128", "--shard", "x=_,tp"])
    assert r.exit_code == 2
    assert "--shard places arrays on a slice: give --topology too" in r.output
    r = CliRunner().invoke(main, ["xla", "kernels.matmul.kernel:matmul", "--shape", "x=8x128", "--hw", "v5e",
                                  "--topology", "v6e:2x2"])
    assert r.exit_code == 2 and "--topology 'v6e:2x2': tpu-v5e slices" in r.output


def test_reference_rejects_mla():
    from perfmodel.model.configs import get_model
    from perfmodel.xla.reference import layer_groups

    with pytest.raises(InputError, match="latent attention"):
        layer_groups(get_model("deepseek-v3"))
    groups = layer_groups(get_model("gemma-3-27b"))
    assert [g.attention_label for g in groups][0] == "attention(global)" and groups[1].window


SLICED_PREFETCH = """HloModule jit_f

ENTRY %main (w: bf16[64,512]) -> s8[16384] {
  %w = bf16[64,512]{1,0} parameter(0)
  %b = s8[65536]{0} bitcast(%w)
  %slice-start = ((s8[65536]{0}), s8[16384]{0:S(1)}, s32[]{:S(2)}) slice-start(%b), slice={[0:16384]}
  ROOT %slice-done = s8[16384]{0:S(1)} slice-done(%slice-start)
}
"""


def test_slice_dma_reads_its_slice_not_the_whole_operand():
    comps = hlo.parse_module(SLICED_PREFETCH)
    main_ = hlo.entry(comps)
    w = hlo.instruction_work(comps, main_.by_name()["slice-start"], {i.name: i.arrays for i in main_.instructions})
    # one quarter (16384 B) of the 64x512 bf16 = 65536 B array is copied from HBM into VMEM: 16384 B read from
    # HBM + 16384 B written to VMEM (the whole operand would be 65536 B: four such DMAs read it once)
    assert (w.bytes, w.hbm_bytes) == (2 * 16384, 16384)


# Two layers' K gathers: identical fused computations under two names. The compiler dumps the schedule of the
# program once (under gather_fusion); gather_fusion.1 runs the same program. A third fusion differs (f32).
TWINS = """HloModule jit_twins

%g0 (p0: bf16[64,128], p1: s32[16]) -> bf16[16,128] {
  %p0 = bf16[64,128]{1,0} parameter(0)
  %p1 = s32[16]{0} parameter(1)
  ROOT %g = bf16[16,128]{1,0} gather(%p0, %p1), offset_dims={1}, collapsed_slice_dims={0}, start_index_map={0}, index_vector_dim=1, slice_sizes={1,128}, metadata={op_name="jit(f)/attention/gather"}
}

%g1 (q0: bf16[64,128], q1: s32[16]) -> bf16[16,128] {
  %q0 = bf16[64,128]{1,0} parameter(0)
  %q1 = s32[16]{0} parameter(1)
  ROOT %h = bf16[16,128]{1,0} gather(%q0, %q1), offset_dims={1}, collapsed_slice_dims={0}, start_index_map={0}, index_vector_dim=1, slice_sizes={1,128}, metadata={op_name="jit(f)/attention/gather"}
}

%g2 (r0: f32[64,128], r1: s32[16]) -> f32[16,128] {
  %r0 = f32[64,128]{1,0} parameter(0)
  %r1 = s32[16]{0} parameter(1)
  ROOT %k = f32[16,128]{1,0} gather(%r0, %r1), offset_dims={1}, collapsed_slice_dims={0}, start_index_map={0}, index_vector_dim=1, slice_sizes={1,128}
}

ENTRY %main (a: bf16[64,128], b: bf16[64,128], c: f32[64,128], i: s32[16]) -> (bf16[16,128], bf16[16,128], f32[16,128]) {
  %a = bf16[64,128]{1,0} parameter(0)
  %b = bf16[64,128]{1,0} parameter(1)
  %c = f32[64,128]{1,0} parameter(2)
  %i = s32[16]{0} parameter(3)
  %gather_fusion = bf16[16,128]{1,0} fusion(%a, %i), kind=kCustom, calls=%g0, metadata={op_name="jit(f)/attention/gather"}
  %gather_fusion.1 = bf16[16,128]{1,0} fusion(%b, %i), kind=kCustom, calls=%g1, metadata={op_name="jit(f)/attention/gather"}
  %gather_fusion.2 = f32[16,128]{1,0} fusion(%c, %i), kind=kCustom, calls=%g2
  ROOT %t = (bf16[16,128]{1,0}, bf16[16,128]{1,0}, f32[16,128]{1,0}) tuple(%gather_fusion, %gather_fusion.1, %gather_fusion.2)
}
"""


def test_ops_sharing_one_dumped_program_are_all_counted():
    p = build_program(_report({"gather_fusion": 3_000}), get_chip("v5e"), hlo_text=TWINS)
    ops = {o.hlo_name: o for o in p.ops}
    # the twin without a dump of its own runs the dumped program: same bundles, same bytes (16 rows of 128 bf16
    # gathered = 4096 B read + 64 B of indices + 4096 B written = 8256 B)
    assert ops["gather_fusion.1"].bundles == ops["gather_fusion"].bundles == 3_000
    assert ops["gather_fusion.1"].hbm_bytes == ops["gather_fusion"].hbm_bytes == 4096 + 64 + 4096
    # the f32 gather is another program with no dump: still counted, from its bytes (8192 + 64 + 8192 B)
    assert ops["gather_fusion.2"].bundles is None and ops["gather_fusion.2"].hbm_bytes == 8192 + 64 + 8192
    assert any("timed from their bytes alone" in n for n in p.notes)


# A weight prefetched into VMEM while an op on VMEM data runs, then read by a dot after its copy-done.
OVERLAP = """HloModule jit_overlap

%neg (p: bf16[8,256]) -> bf16[8,256] {
  %p = bf16[8,256]{1,0:S(1)} parameter(0)
  ROOT %n = bf16[8,256]{1,0:S(1)} negate(%p)
}

ENTRY %main (w: bf16[256,512], x: bf16[8,256]) -> bf16[8,512] {
  %w = bf16[256,512]{1,0} parameter(0)
  %x = bf16[8,256]{1,0:S(1)} parameter(1)
  %copy-start = (bf16[256,512]{1,0:S(1)}, bf16[256,512]{1,0}, u32[]) copy-start(%w)
  %fusion.1 = bf16[8,256]{1,0:S(1)} fusion(%x), kind=kLoop, calls=%neg
  %copy-done = bf16[256,512]{1,0:S(1)} copy-done(%copy-start)
  ROOT %d = bf16[8,512]{1,0:S(1)} dot(%fusion.1, %copy-done), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}
"""


@pytest.mark.parametrize("between_bundles", [1_000_000, 10])
def test_dma_runs_under_the_ops_between_its_start_and_done(between_bundles):
    chip = get_chip("v5e")
    p = build_program(_report({"fusion.1": between_bundles, "d": 100}), chip, hlo_text=OVERLAP)
    ops = {o.hlo_name: o for o in p.ops}
    dma, between = ops["copy-start"], ops["fusion.1"]
    assert dma.kind == "dma" and dma.hbm_bytes == 256 * 512 * 2  # read 262,144 B from HBM (VMEM write apart)
    assert between.memory_s == 0  # all in VMEM: HBM idle for its whole time
    # 1M bundles (~0.7 ms) hide the whole ~0.4 us copy; 10 bundles (~7 ns) hide 7 ns of it, the done waits
    # for the rest
    assert p.dma_hidden_s == pytest.approx(min(dma.time_s, between.time_s))
    assert p.step_s == pytest.approx(p.serial_s - p.dma_hidden_s)
    assert p.serial_s == pytest.approx(dma.time_s + between.time_s + ops["d"].time_s)


# Two layers' KV-cache writes: a Pallas kernel that updates the cache in place (output aliased to operand 1),
# identical but for its name; the compiler dumped the schedule of the first only.
INPLACE = """HloModule jit_inplace

ENTRY %main (new: bf16[8,4,128], c0: bf16[1024,16,128], c1: bf16[1024,16,128]) -> (bf16[1024,16,128], bf16[1024,16,128]) {
  %new = bf16[8,4,128]{2,1,0} parameter(0)
  %c0 = bf16[1024,16,128]{2,1,0} parameter(1)
  %c1 = bf16[1024,16,128]{2,1,0} parameter(2)
  %kv_update.1 = bf16[1024,16,128]{2,1,0} custom-call(%new, %c0), custom_call_target="tpu_custom_call", output_to_operand_aliasing={{}: (1, {})}, metadata={op_name="jit(f)/kv_write/pallas_call" stack_frame_id=1}, backend_config={"custom_call_config":{"body":"KERNEL","cost_estimate":{"flops":"0","transcendentals":"0","bytes_accessed":"16400","remote_bytes_transferred":"0"}}}
  %kv_update.2 = bf16[1024,16,128]{2,1,0} custom-call(%new, %c1), custom_call_target="tpu_custom_call", output_to_operand_aliasing={{}: (1, {})}, metadata={op_name="jit(f)/kv_write/pallas_call" stack_frame_id=2}, backend_config={"custom_call_config":{"body":"KERNEL","cost_estimate":{"flops":"0","transcendentals":"0","bytes_accessed":"16400","remote_bytes_transferred":"0"}}}
  %kv_update.3 = bf16[1024,16,128]{2,1,0} custom-call(%new, %c1), custom_call_target="tpu_custom_call", output_to_operand_aliasing={{}: (1, {})}, backend_config={"custom_call_config":{"body":"OTHER"}}
  ROOT %t = (bf16[1024,16,128]{2,1,0}, bf16[1024,16,128]{2,1,0}) tuple(%kv_update.1, %kv_update.2)
}
"""


def _kernel(name: str, program_bundles: int | None = None, loop=None):
    """A Pallas call of a compile report: its program's bundles (None: the compiler dumped no schedule for it)
    and its grid loop's stats (None: no grid loop)."""
    from perfmodel.compiler.api import KernelCompile

    return KernelCompile(hlo_name=name, scoped_vmem_bytes=None, program_bundles=program_bundles,
                         mxus=None if program_bundles is None else 0, has_grid_loop=loop is not None, loop=loop,
                         body_bundles_path=None)


def _pipelined_loop():
    """tests/compiler/schedules.py's PIPELINED loop read as a grid loop: 16 bundles, 8 trips, 3 stages, a
    12-bundle step guard."""
    from perfmodel.compiler.bundles import build_schedule, loop_stats
    from tests.compiler.schedules import PIPELINED

    sched = build_schedule(PIPELINED)
    return loop_stats(sched, sched.loops[0])


def test_in_place_kernel_counts_what_it_touches_and_twins_share_its_schedule():
    rep = _report({})
    rep.kernels = (_kernel("kv_update.1", 500), _kernel("kv_update.2"), _kernel("kv_update.3"))
    comps = hlo.parse_module(INPLACE)
    main_ = hlo.entry(comps)
    shapes = {i.name: i.arrays for i in main_.instructions}
    # the kernel's CostEstimate: 8 tokens x 4 heads x 128 x 2 B = 8,192 B read + 8,192 B written + 16 B of slots
    # = 16,400 B; not the 4 MiB cache (1024 x 16 x 128 x 2 B) read and written whole
    assert hlo.instruction_work(comps, main_.by_name()["kv_update.1"], shapes).hbm_bytes == 16_400
    # without an estimate: the other operand (8,192 B) read and as much written
    assert hlo.instruction_work(comps, main_.by_name()["kv_update.3"], shapes).hbm_bytes == 2 * 8_192
    p = build_program(rep, get_chip("v5e"), hlo_text=INPLACE)
    ops = {o.hlo_name: o for o in p.ops}
    # kv_update.2 is the same kernel (same body) as kv_update.1: the same schedule; kv_update.3 is another kernel
    assert p.ops and ops["kv_update.2"].bundles == ops["kv_update.1"].bundles is not None
    assert ops["kv_update.3"].bundles is None


def test_pallas_grid_loop_counts_its_pipelines_fill_and_drain_without_the_guarded_work():
    # The kernel's grid loop is PIPELINED's: 16 bundles, 8 trips, 3 stages, a 12-bundle step guard; 4 more bundles
    # outside it. Per call: 4 x 8 + 12 x 6 + 4 = 108 bundles (every trip in full would be 16 x 8 + 4 = 132).
    rep = _report({})
    rep.kernels = (_kernel("kv_update.1", 20, _pipelined_loop()), _kernel("kv_update.2"), _kernel("kv_update.3"))
    ops = {o.hlo_name: o for o in build_program(rep, get_chip("v5e"), hlo_text=INPLACE).ops}
    assert ops["kv_update.1"].bundles == ops["kv_update.2"].bundles == 108  # its twin: the same program


def test_weight_slices_concatenated_in_vmem_belong_to_their_matmul():
    from perfmodel.xla.program import _consumer_op_name

    text = """HloModule m

ENTRY %main (w: bf16[256,512], x: bf16[8,256]) -> bf16[8,512] {
  %w = bf16[256,512]{1,0} parameter(0)
  %x = bf16[8,256]{1,0} parameter(1)
  %b = s8[262144]{0} bitcast(%w)
  %slice-start = ((s8[262144]{0}), s8[131072]{0:S(1)}, s32[]{:S(2)}) slice-start(%b), slice={[0:131072]}
  %slice-start.1 = ((s8[262144]{0}), s8[131072]{0:S(1)}, s32[]{:S(2)}) slice-start(%b), slice={[131072:262144]}
  %slice-done = s8[131072]{0:S(1)} slice-done(%slice-start)
  %slice-done.1 = s8[131072]{0:S(1)} slice-done(%slice-start.1)
  %cat = bf16[256,512]{1,0:S(1)} custom-call(%slice-done, %slice-done.1), custom_call_target="ConcatBitcast"
  ROOT %d = bf16[8,512]{1,0} dot(%x, %cat), lhs_contracting_dims={1}, rhs_contracting_dims={0}, metadata={op_name="jit(step)/qkv_proj/dot_general"}
}
"""
    comps = hlo.parse_module(text)
    main_ = hlo.entry(comps)
    # slice-start -> slice-done -> ConcatBitcast (assembles the weight in VMEM) -> the qkv_proj dot
    for name in ("slice-start", "slice-start.1"):
        assert _consumer_op_name(comps, main_, main_.by_name()[name], {}) == "jit(step)/qkv_proj/dot_general"


# XLA's ragged-dot kernel (7x, lhs [262144, 256] x rhs [256, 256, 7168], f32 out), as the compiled HLO prints it.
RAGGED_DOT_HLO = """HloModule m

ENTRY %main (lhs: bf16[262144,256], rhs: bf16[256,256,7168], a: s32[1], b: s32[257], c: s32[1279], d: s32[1279]) -> f32[262144,7168] {
  %lhs = bf16[262144,256]{1,0} parameter(0)
  %rhs = bf16[256,256,7168]{2,1,0} parameter(1)
  %a = s32[1]{0} parameter(2)
  %b = s32[257]{0} parameter(3)
  %c = s32[1279]{0} parameter(4)
  %d = s32[1279]{0} parameter(5)
  ROOT %ragged-dot-none = f32[262144,7168]{1,0} custom-call(%a, %b, %c, %d, %a, %lhs, %rhs), custom_call_target="tpu_custom_call", frontend_attributes={mosaic_fusion_entry_point="true",ragged_dot_tiling="256,256,4608"}
}
"""


def test_xla_ragged_dot_kernel_grid_from_its_tiles():
    # RAGGED_DOT_HLO's tiles 256 x 256 x 4608 -> 2 column tiles (7168 / 4608, rounded up), 1 K tile; the group metadata has
    # 262144 / 256 + 256 - 1 = 1279 entries, the bound on row-tile visits: 2 x 1279 = 2558 grid steps. The second
    # column tile reads all of lhs again: 262144 x 256 x 2 B = 134,217,728 B more.
    from perfmodel.xla import hlo
    from perfmodel.xla.program import ragged_dot_grid

    comps = hlo.parse_module(RAGGED_DOT_HLO)
    main = hlo.entry(comps)
    shapes = {i.name: i.arrays for i in main.instructions}
    grid = ragged_dot_grid(main.by_name()["ragged-dot-none"], shapes)
    assert grid is not None and grid.steps == 2 * 1279 and grid.extra_hbm_bytes == 262144 * 256 * 2
    assert ragged_dot_grid(main.by_name()["lhs"], shapes) is None


def test_xla_ragged_dot_kernel_runs_its_grid_plus_the_pipelines_fill_and_drain():
    import dataclasses

    # Its grid loop's trip count is dynamic (None in the schedule): 2,558 grid steps (above) plus the 2 iterations
    # that fill and drain a 3-stage pipeline. PIPELINED's loop as its body: 16 x 2,560 - 12 x 2 (the step guard
    # skipped on those 2) + 4 bundles outside the loop = 40,940.
    rep = _report({})
    rep.kernels = (_kernel("ragged-dot-none", 20, dataclasses.replace(_pipelined_loop(), trip_count=None)),)
    ops = {o.hlo_name: o for o in build_program(rep, get_chip("tpu-7x"), hlo_text=RAGGED_DOT_HLO).ops}
    assert ops["ragged-dot-none"].bundles == 40_940


def _ragged_contraction_hlo(second_mask: str) -> str:
    """jax's ragged contraction lowered as XLA does it (shrunk from 7x-rd-fwd-xla-060's program): lhs [R=16, K=8]
    and rhs [R, N=4] broadcast over G=4 groups, each masked to its group's rows, then one base-dilated
    convolution contracting all R rows per group (window = lhs dilation = G: one tap per output)."""
    def select(name: str, width: int) -> str:
        return (f"%{name}_sel (x: bf16[16,{width}], m: pred[4,16]) -> bf16[4,16,{width}] {{\n"
                "  %m = pred[4,16]{1,0} parameter(1)\n"
                f"  %mb = pred[4,16,{width}]{{2,1,0}} broadcast(%m), dimensions={{0,1}}\n"
                f"  %x = bf16[16,{width}]{{1,0}} parameter(0)\n"
                f"  %xb = bf16[4,16,{width}]{{2,1,0}} broadcast(%x), dimensions={{1,2}}\n"
                "  %zero = bf16[] constant(0)\n"
                f"  %zb = bf16[4,16,{width}]{{2,1,0}} broadcast(%zero), dimensions={{}}\n"
                f"  ROOT %s = bf16[4,16,{width}]{{2,1,0}} select(%mb, %xb, %zb)\n}}\n\n")
    return ("HloModule jit_ragged_dot\n\n" + select("lhs", 8) + select("rhs", 4)
            + "%conv_fusion (a: bf16[16,8], b: bf16[16,4], m0: pred[4,16], m1: pred[4,16]) -> bf16[4,8,4] {\n"
              "  %a = bf16[16,8]{1,0} parameter(0)\n  %b = bf16[16,4]{1,0} parameter(1)\n"
              "  %m0 = pred[4,16]{1,0} parameter(2)\n  %m1 = pred[4,16]{1,0} parameter(3)\n"
              "  %fa = bf16[4,16,8]{2,1,0} fusion(%a, %m0), kind=kLoop, calls=%lhs_sel\n"
              f"  %fb = bf16[4,16,4]{{2,1,0}} fusion(%b, %{second_mask}), kind=kLoop, calls=%rhs_sel\n"
              "  ROOT %c = bf16[4,8,4]{2,1,0} convolution(%fa, %fb), window={size=4 stride=3 lhs_dilate=4}, "
              "dim_labels=0fb_0io->0bf\n}\n")


@pytest.mark.parametrize("second_mask, conv_flops", [
    # one mask on both operands: each of the 16 rows is in one of the 4 groups:
    # 2 x 128 outputs (4 x 8 x 4) x 16 rows / 4 groups = 1024
    ("m0", 1024.0),
    # different masks: nothing says the rows are shared out, so the dense count: 2 x 128 x 16 = 4096
    ("m1", 4096.0),
])
def test_ragged_contraction_convolution_counts_each_row_once(second_mask, conv_flops):
    comps = hlo.parse_module(_ragged_contraction_hlo(second_mask))
    comp = comps["conv_fusion"]
    conv = comp.root
    shapes = {i.name: i.arrays for i in comp.instructions}
    flops, _ = hlo.instruction_flops(comps, conv, shapes, {}, comp.by_name())
    assert flops == conv_flops
    # without its computation's producers the convolution is counted dense
    assert hlo.instruction_flops(comps, conv, shapes, {})[0] == 4096.0


def test_a_fusion_xlas_cost_model_gave_up_on_is_flagged():
    # XLA writes estimated_cycles = INT64_MAX into a fusion's backend config when its cost model gives up on the
    # window config (the deviceless programs of some causal XLA attention fusions, several times the measured
    # time): the program says so, naming the op and its bundles; other fusions are not flagged.
    from perfmodel.xla.program import NO_ESTIMATE_NOTE

    flagged = HLO.replace('calls=%fused_dot, metadata', 'calls=%fused_dot, backend_config={"window_config":'
                          '{"estimated_cycles":"9223372036854775807"}}, metadata')
    p = build_program(_report({"fusion.1": 30_000, "fusion.2": 10}), get_chip("v5e"), hlo_text=flagged)
    (note,) = [n for n in p.notes if NO_ESTIMATE_NOTE in n]
    assert note.startswith("fusion.1:") and "30,000 bundles" in note
    plain = build_program(_report({"fusion.1": 30_000, "fusion.2": 10}), get_chip("v5e"), hlo_text=HLO)
    assert not any(NO_ESTIMATE_NOTE in n for n in plain.notes)


# A loop-body matmul fusion that slices one chunk of a [4, 256, 128] array through a nested fusion which first
# re-tiles the whole array (a copy in its own fused computation), as XLA compiles tokamax's chunked attention.
RETILED_SLICE = """HloModule jit_chunk

%retile (c0: bf16[4,256,128]) -> bf16[4,256,128] {
  %c0 = bf16[4,256,128]{2,1,0:T(16,128)(2,1)} parameter(0)
  ROOT %cp = bf16[4,256,128]{2,1,0:T(8,128)(2,1)} copy(%c0)
}

%chunk (s0: bf16[4,256,128], s1: s32[]) -> bf16[4,64,128] {
  %s0 = bf16[4,256,128]{2,1,0} parameter(0)
  %s1 = s32[] parameter(1)
  %re = bf16[4,256,128]{2,1,0} fusion(%s0), kind=kLoop, calls=%retile
  %z = s32[] constant(0)
  ROOT %ds = bf16[4,64,128]{2,1,0} dynamic-slice(%re, %z, %s1, %z), dynamic_slice_sizes={4,64,128}
}

%body (k0: bf16[4,256,128], k1: s32[], k2: bf16[4,128,64]) -> bf16[4,128,128] {
  %k0 = bf16[4,256,128]{2,1,0} parameter(0)
  %k1 = s32[] parameter(1)
  %k2 = bf16[4,128,64]{2,1,0} parameter(2)
  %kc = bf16[4,64,128]{2,1,0} fusion(%k0, %k1), kind=kLoop, calls=%chunk
  ROOT %d = bf16[4,128,128]{2,1,0} dot(%k2, %kc), lhs_batch_dims={0}, rhs_batch_dims={0}, lhs_contracting_dims={2}, rhs_contracting_dims={1}
}

ENTRY %main (k: bf16[4,256,128], i: s32[], q: bf16[4,128,64]) -> bf16[4,128,128] {
  %k = bf16[4,256,128]{2,1,0} parameter(0)
  %i = s32[] parameter(1)
  %q = bf16[4,128,64]{2,1,0} parameter(2)
  ROOT %fusion.7 = bf16[4,128,128]{2,1,0} fusion(%k, %i, %q), kind=kOutput, calls=%body
}
"""


def test_a_slice_after_a_nested_retiling_reads_the_slice():
    comps = hlo.parse_module(RETILED_SLICE)
    main_ = hlo.entry(comps)
    w = hlo.instruction_work(comps, main_.by_name()["fusion.7"], {i.name: i.arrays for i in main_.instructions})
    # reads the [4, 64, 128] bf16 chunk (65,536 B; the whole array is 262,144 B), the index (4 B) and q
    # [4, 128, 64] (65,536 B); writes [4, 128, 128] bf16 (131,072 B)
    assert w.bytes == 65536 + 4 + 65536 + 131072
