#!/usr/bin/env python3
"""sass_counts.py: the instructions each kernel of ./train_rl issues, by class, read from its sm_90 SASS,
written as cuda/perf/sass_counts.h (the table cuda/perf/kernel_perf_model.h prices).

    python3 dev/sass_counts.py [--binary train_rl] [--out cuda/perf/sass_counts.h] [--sass FILE] [--list]

Builds nothing: run `make -j1 train_rl` first (dev/sass_counts.sh does both). cuobjdump and nvdisasm come from
the `nvidia-cuda-cuobjdump` and `nvidia-cuda-nvdisasm` wheels (pip download --no-deps -d /tmp/nvwheels ...),
unpacked under /tmp/nvwheels/sass, unless $CUOBJDUMP or PATH names them.

Each kernel's instructions are split into loops and the rest: a loop is the span from a backward
branch's target to the branch (BRA to a lower address); spans nest. For each loop and for the code
outside every loop the table holds the count of each class (static counts: every instruction of a span
is counted once per pass through it, predicated or not, as the SM issues it). --list prints the loops
of every kernel instead.
"""
import argparse
import glob
import os
import re
import shutil
import subprocess
import sys
import zipfile

# Instruction classes, in the order of cuda/perf/sass_counts.h's SassClass. Each opcode (the mnemonic
# before its first '.') belongs to one; widths (.64, .128) are read from the modifiers of memory ops.
CLASSES = [
    ("fp32", "FP32 add, multiply, FMA, min/max, compare (FADD FMUL FFMA FMNMX FSETP FSEL ...)"),
    ("fp16x2", "packed 16-bit arithmetic (HADD2 HMUL2 HFMA2 HMNMX2 HSETP2)"),
    ("conversion", "type conversions (I2F F2I F2F F2FP I2FP F2IP FRND)"),
    ("mufu", "special functions (MUFU: exp2, rcp, rsqrt, log2, sin, cos)"),
    ("integer", "integer and logic (IADD3 IMAD LEA LOP3 SHF ISETP IMNMX SEL PRMT POPC FLO ...)"),
    ("move", "moves and special registers (MOV S2R S2UR CS2R P2R R2P and uniform-datapath U* ops)"),
    ("macs", "multiply-adds per thread: FFMA, FMUL paired with FADD, 2 per HFMA2, 64 per m16n8k16 MMA"),
    ("mma", "tensor-core MMA (HMMA IMMA HGMMA QGMMA), counted in m16n8k16-equivalents"),
    ("shuffle", "warp shuffles and votes (SHFL VOTE MATCH REDUX)"),
    ("lds_bytes", "shared-memory bytes loaded per thread (LDS by width, LDSM x1/x2/x4)"),
    ("sts_bytes", "shared-memory bytes stored per thread (STS by width)"),
    ("ldg_bytes", "global/generic bytes loaded per thread (LDG, LD by width)"),
    ("stg_bytes", "global/generic bytes stored per thread (STG, ST, RED, ATOM by width)"),
    ("ldgsts_bytes", "cp.async bytes per thread (LDGSTS by width)"),
    ("lds_ops", "shared-memory load instructions (LDS LDSM)"),
    ("ldg_ops", "global/generic load instructions (LDG LD)"),
    ("barrier", "barriers and async waits (BAR DEPBAR LDGDEPBAR MEMBAR SYNCS)"),
    ("control", "branches and the rest (BRA BSSY BSYNC EXIT NOP RET CALL ...)"),
    ("total", "every instruction"),
]
CLASS_INDEX = {name: i for i, (name, _) in enumerate(CLASSES)}

FP32 = {"FADD", "FMUL", "FFMA", "FMNMX", "FSETP", "FSET", "FSEL", "FCHK", "FSWZADD", "FMUL32I", "FADD32I", "FFMA32I"}
FP16 = {"HADD2", "HMUL2", "HFMA2", "HMNMX2", "HSETP2", "HSET2", "HADD2_32I", "HMUL2_32I", "HFMA2_32I"}
CONV = {"I2F", "F2I", "F2F", "F2FP", "I2FP", "F2IP", "FRND", "I2I", "I2IP"}
INTEGER = {"IADD3", "IADD", "IMAD", "IMADSP", "IMUL", "LEA", "LOP3", "LOP", "SHF", "SHL", "SHR", "ISETP", "IMNMX",
           "SEL", "PRMT", "POPC", "FLO", "BREV", "BMSK", "IABS", "IDP", "IDP4A", "SGXT", "PLOP3", "PSETP", "ISCADD",
           "LOP32I", "IADD32I", "IMUL32I", "ISET", "BFE", "BFI", "VIADD", "VIMNMX", "LEPC"}
MOVE = {"MOV", "MOV32I", "S2R", "S2UR", "CS2R", "P2R", "R2P", "R2UR", "LDC", "ULDC", "SHFL_", "PRMT_"}
MMA = {"HMMA", "IMMA", "HGMMA", "QGMMA", "IGMMA", "BMMA", "DMMA"}
SHUFFLE = {"SHFL", "VOTE", "VOTEU", "MATCH", "REDUX"}
BARRIER = {"BAR", "DEPBAR", "LDGDEPBAR", "MEMBAR", "SYNCS", "WARPSYNC", "ARRIVES", "ERRBAR", "CCTL", "FENCE"}

INSTRUCTION = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P[T0-9]\s+)?([A-Z][A-Z0-9_]*)((?:\.[A-Za-z0-9_]+)*)\s*([^;]*);")
BRANCH_TARGET = re.compile(r"0x([0-9a-f]+)\s*$")


def width(mods, default=4):
    for m in mods:
        if m in ("8", "U8", "S8"):
            return 1
        if m in ("16", "U16", "S16"):
            return 2
        if m in ("64",):
            return 8
        if m in ("128",):
            return 16
    return default


def mma_units(op, mods):
    """m16n8k16-equivalents of one warp-wide MMA (HMMA.16816 BF16/F16 = 1; HMMA.1688 = 1/2; IMMA/QGMMA
    by their shapes' products over 16*8*16; a warpgroup MMA counts per issuing warp)."""
    shape = next((m for m in mods if re.fullmatch(r"\d{3,6}", m)), None)
    if op in ("HGMMA", "QGMMA", "IGMMA"):
        m = re.search(r"64x(\d+)x(\d+)", ".".join(mods))
        if m:  # wgmma m64nNkK issued by 4 warps: each warp's share
            return 64 * int(m.group(1)) * int(m.group(2)) / 4 / (16 * 8 * 16)
        return 1.0
    if shape == "16816" or shape == "16832":
        return 1.0 if shape == "16816" else 2.0
    if shape == "1688":
        return 0.5
    if shape == "884":
        return 0.125
    return 1.0


def classify(op, mods):
    """(class name, amount) pairs an instruction adds besides one to 'total'."""
    if op in FP32:
        return [("fp32", 1)]
    if op in FP16:
        return [("fp16x2", 1)]
    if op in CONV:
        return [("conversion", 1)]
    if op == "MUFU":
        return [("mufu", 1)]
    if op in MMA:
        return [("mma", mma_units(op, mods))]
    if op in SHUFFLE:
        return [("shuffle", 1)]
    if op == "LDS":
        return [("lds_bytes", width(mods)), ("lds_ops", 1)]
    if op == "LDSM":  # ldmatrix: x1/x2/x4 8x8 matrices of 16-bit, 16 bytes per thread per 4 matrices... per thread 4 B each
        n = 4 if "x4" in ".".join(mods).lower() or "M88.4" in ".".join(mods) else 2 if "M88.2" in ".".join(mods) else 1
        return [("lds_bytes", 4 * n), ("lds_ops", 1)]
    if op == "STS":
        return [("sts_bytes", width(mods))]
    if op in ("LDG", "LD", "LDL"):
        return [("ldg_bytes", width(mods)), ("ldg_ops", 1)]
    if op in ("STG", "ST", "STL", "RED", "ATOM", "ATOMG", "ATOMS"):
        return [("stg_bytes", width(mods))]
    if op == "LDGSTS":
        return [("ldgsts_bytes", width(mods))]
    if op in BARRIER:
        return [("barrier", 1)]
    if op in INTEGER:
        return [("integer", 1)]
    if op in MOVE or op.startswith("U"):
        return [("move", 1)]
    return [("control", 1)]


def counts_of(instructions):
    c = [0.0] * len(CLASSES)
    ops = {}
    for _, op, mods, _ in instructions:
        for name, amount in classify(op, mods):
            c[CLASS_INDEX[name]] += amount
        c[CLASS_INDEX["total"]] += 1
        ops[op] = ops.get(op, 0) + 1
    # a multiply-add is one FFMA, or an FMUL and an FADD (the engine builds without contraction where it
    # must match the CPU bit for bit), 2 per packed HFMA2, 16*8*16/32 per thread of an m16n8k16 MMA
    c[CLASS_INDEX["macs"]] = (ops.get("FFMA", 0) + min(ops.get("FMUL", 0), ops.get("FADD", 0)) + 2 * ops.get("HFMA2", 0)
                              + 64 * c[CLASS_INDEX["mma"]])
    return c


def find_cuobjdump():
    """cuobjdump, with nvdisasm (which it runs) beside it: $CUOBJDUMP, the wheels' unpacked under
    /tmp/nvwheels/sass (unpacked there from /tmp/nvwheels/*.whl when missing), or one on PATH."""
    if os.environ.get("CUOBJDUMP"):
        return os.environ["CUOBJDUMP"]
    home = "/tmp/nvwheels/sass"
    for tool in ("cuobjdump", "nvdisasm"):
        if not glob.glob(f"{home}/nvidia/*/bin/{tool}"):
            for wheel in glob.glob(f"/tmp/nvwheels/nvidia_cuda_{tool}-*.whl")[:1]:
                with zipfile.ZipFile(wheel) as z:
                    z.extractall(home)
        for path in glob.glob(f"{home}/nvidia/*/bin/{tool}"):
            os.chmod(path, 0o755)
    found = glob.glob(f"{home}/nvidia/*/bin/cuobjdump")
    if found and glob.glob(f"{home}/nvidia/*/bin/nvdisasm"):
        os.environ["PATH"] = os.path.dirname(found[0]) + os.pathsep + os.environ.get("PATH", "")
        return found[0]
    if shutil.which("cuobjdump") and shutil.which("nvdisasm"):
        return shutil.which("cuobjdump")
    sys.exit("sass_counts.py: no cuobjdump and nvdisasm: run `pip download --no-deps -d /tmp/nvwheels "
             "nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm` (or set CUOBJDUMP)")


def demangle(names):
    out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True, check=True).stdout
    return out.split("\n")[: len(names)]


def short_name(demangled):
    """fp8rl::kv_decode_split_kernel<128, unsigned char>: the kernel with its template arguments."""
    name = re.sub(r"^void ", "", demangled)
    depth, end = 0, len(name)
    for i, ch in enumerate(name):  # cut at the parameter list's '('
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif ch == "(" and depth == 0:
            end = i
            break
    return name[:end].replace("fp8rl::", "")


def parse(sass_text):
    """{mangled name: [(address, opcode, modifiers, operands)]} for every sm_90 function."""
    kernels, current = {}, None
    for line in sass_text.splitlines():
        if "Function :" in line:
            current = line.split("Function :")[1].strip()
            kernels[current] = []
            continue
        m = INSTRUCTION.match(line)
        if m and current:
            kernels[current].append((int(m.group(1), 16), m.group(2), [x for x in m.group(3).split(".") if x], m.group(4)))
    return kernels


def loops_of(instructions):
    """[(start, end)] of each loop: a backward branch's target .. the branch, outermost first."""
    spans = set()
    for addr, op, _, operands in instructions:
        if op in ("BRA", "JMP", "BRX"):
            m = BRANCH_TARGET.search(operands)
            if m and int(m.group(1), 16) <= addr:
                spans.add((int(m.group(1), 16), addr))
    return sorted(spans, key=lambda s: (s[0], -s[1]))


def kernel_table(instructions):
    """The rest (outside every loop) and each loop's own instructions (nested loops' excluded), with its
    parent loop's index (-1: none)."""
    spans = loops_of(instructions)
    parent = []
    for i, (s, e) in enumerate(spans):
        enclosing = [j for j, (s2, e2) in enumerate(spans) if j != i and s2 <= s and e <= e2 and (s2, e2) != (s, e)]
        parent.append(max(enclosing, key=lambda j: spans[j][0] - spans[j][1]) if enclosing else -1)
    own = [[] for _ in spans]
    rest = []
    for ins in instructions:
        inside = [i for i, (s, e) in enumerate(spans) if s <= ins[0] <= e]
        if not inside:
            rest.append(ins)
        else:  # the innermost span holding it
            own[min(inside, key=lambda i: spans[i][1] - spans[i][0])].append(ins)
    return counts_of(rest), [(spans[i][0], spans[i][1], parent[i], counts_of(own[i])) for i in range(len(spans))]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--binary", default="train_rl")
    ap.add_argument("--out", default="cuda/perf/sass_counts.h")
    ap.add_argument("--sass", help="read this cuobjdump -sass output instead of running cuobjdump")
    ap.add_argument("--list", action="store_true")
    args = ap.parse_args()
    if args.sass:
        text = open(args.sass).read()
    else:
        if not os.path.exists(args.binary):
            sys.exit(f"sass_counts.py: no {args.binary}: run `make -j1 train_rl` first (needs nvcc)")
        text = subprocess.run([find_cuobjdump(), "-sass", args.binary], capture_output=True, text=True, check=True).stdout
    kernels = parse(text)
    if not kernels:
        sys.exit("sass_counts.py: no sm_90 functions in the SASS: was the binary built with nvcc for sm_90?")
    mangled = sorted(kernels)
    names = [short_name(d) for d in demangle(mangled)]
    rows = sorted(zip(names, mangled))
    if args.list:
        for name, m in rows:
            rest, loops = kernel_table(kernels[m])
            print(f"{name}: {int(rest[-1])} outside loops")
            for i, (s, e, p, c) in enumerate(loops):
                nz = ", ".join(f"{CLASSES[k][0]} {c[k]:g}" for k in range(len(CLASSES) - 1) if c[k])
                print(f"  loop {i} [{s:#x}, {e:#x}] parent {p}: {int(c[-1])} instructions ({nz})")
        return
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True).stdout.strip()
    tool = subprocess.run([find_cuobjdump() if not args.sass else "true", "--version"], capture_output=True, text=True).stdout
    tool = next((l.strip() for l in tool.splitlines() if "release" in l), "cuobjdump output given by --sass")
    out = []
    out.append("// sass_counts.h: GENERATED by dev/sass_counts.py: do not edit. Regenerate after a kernel changes:")
    out.append("//     dev/sass_counts.sh      (make -j1 train_rl, then python3 dev/sass_counts.py)")
    out.append(f"// from ./{args.binary} built at commit {commit}{' with uncommitted changes' if dirty else ''} "
               f"(nvcc -O3 sm_90), read by cuobjdump: {tool}.")
    out.append("// Per kernel (template arguments included): the instructions of each class outside every loop,")
    out.append("// then each loop's own (its nested loops' not included) with its parent loop (-1: none); a loop is a")
    out.append("// backward branch's target .. the branch. Counts are per thread (every warp-wide instruction once).")
    out.append("#pragma once")
    out.append("")
    out.append("namespace fp8rl {")
    out.append("")
    out.append("enum SassClass {")
    for name, what in CLASSES:
        out.append(f"    Sass_{name},  // {what}")
    out.append("    kSassClasses")
    out.append("};")
    out.append("")
    out.append("struct SassLoop {")
    out.append("    int start, end, parent;  // byte addresses in the kernel; parent: the enclosing loop's index, -1: none")
    out.append("    float counts[kSassClasses];")
    out.append("};")
    out.append("struct SassKernel {")
    out.append("    const char* name;")
    out.append("    float outside[kSassClasses];  // outside every loop")
    out.append("    int loops;")
    out.append("    const SassLoop* loop;")
    out.append("};")
    out.append("")
    fmt = lambda c: "{" + ", ".join(f"{x:g}" for x in c) + "}"
    body = []
    for k, (name, m) in enumerate(rows):
        rest, loops = kernel_table(kernels[m])
        if loops:
            out.append(f"inline constexpr SassLoop kSassLoops{k}[] = {{")
            for s, e, p, c in loops:
                out.append(f"    {{{s:#x}, {e:#x}, {p}, {fmt(c)}}},")
            out.append("};")
        body.append(f'    {{"{name}", {fmt(rest)}, {len(loops)}, {f"kSassLoops{k}" if loops else "nullptr"}}},')
    out.append("")
    out.append("inline constexpr SassKernel kSassKernels[] = {")
    out.extend(body)
    out.append("};")
    out.append(f"inline constexpr int kSassKernelCount = {len(rows)};")
    out.append("")
    out.append("}  // namespace fp8rl")
    with open(args.out, "w") as f:
        f.write("\n".join(out) + "\n")
    print(f"sass_counts.py: {len(rows)} kernels from {args.binary} (commit {commit}) -> {args.out}")


if __name__ == "__main__":
    main()
