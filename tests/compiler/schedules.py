"""Hand-written VLIW schedules that more than one test module reads (no libtpu needed)."""

# A software-pipelined loop as XLA's fusions compile on TPU: 8 trips, the compiler's stage notes up to 2 (three
# stages), a step guard (0x3..0xe, 12 of the 16 body bundles) holding the one work bundle that pushes to each XLU.
PIPELINED = ("""\
   0x1 LB: > { %s2 = sphi %s1, %s9  ;;  %s3 = sadd.s32 4294967294, %s2 /* iteration index, stage = 2 */ } /* Start region 7 */
   0x2   : > { %p0 = scmp.lt.s32.totalorder %s2, 2  ;;  %11 = sbr.rel (%p0) target = $region9 }
   0x3   : > { %12 = vbcast.lane.b32.xlu0 %v1, 256  ;;  %13 = vxpose.xlu1.b32.cont %v2 }
""" + "".join(f"   0x{4 + i:x}   : > {{ %t{i} = sadd.s32 1, %s3 }}\n" for i in range(9)) + """\
   0xd   : > { %v3 = vpop.permute.xlu0 %12 }
   0xe   : > { %v4 = vpop.trf.xlu1 %13 }
   0xf   : > { %s9 = sadd.s32 1, %s2  ;;  %p18 = scmp.ge.s32.totalorder %s9, 8 /* loop exit test */ } /* Start region 9 */
  0x10   : > { %19 = sbr.rel (!%p18) target = $region7 }
""")
