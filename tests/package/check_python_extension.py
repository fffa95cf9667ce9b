"""The Python extension needs no CUDA toolkit where it is installed (CTest python_extension_standalone).

usage: check_python_extension.py <path of sparsemla/_C*.so> <SPARSEMLA_HAS_CUDA: ON|OFF>

1. Its dynamic section and ldd name no CUDA toolkit library (the runtime is linked in statically)
   and no RPATH into a toolkit.
2. In a fresh interpreter without LD_LIBRARY_PATH, CUDA_HOME or CUDA on PATH (torch not imported:
   it would bring its own runtime), the package next to it imports, no libcudart is mapped,
   built_with_cuda() tells the build, a CPU decode agrees with the float64 reference, and a CUDA
   call on a machine without a driver/GPU fails with sparsemla.Error, not a crash or a load error.
"""

import os
import pathlib
import subprocess
import sys

TOOLKIT_LIBS = ("libcudart", "libcublas", "libnvrtc", "libcupti", "libnvJitLink")

CHILD = r"""
import sys
import numpy as np
import sparsemla

has_cuda = sys.argv[1] == "1"
assert sparsemla.built_with_cuda() == has_cuda, sparsemla.built_with_cuda()
maps = open("/proc/self/maps").read()
assert "libcudart" not in maps, "a shared CUDA runtime was loaded"

rng = np.random.default_rng(7)
H, BS = 8, 64
cache = np.zeros((2, BS * sparsemla.BYTES_PER_TOKEN), dtype=np.uint8)
pos = np.arange(100, dtype=np.int64)
kv = sparsemla.float_to_bf16_bits(rng.standard_normal((100, 512)).astype(np.float32))
sparsemla.write_window(kv, pos, pos, sparsemla.build_rope_table(128, "window"), cache, block_size=BS)
idx, ptr = sparsemla.build_window_lists(np.array([99], dtype=np.int64),
                                        np.array([[0, 1]], dtype=np.int32), BS)
q = sparsemla.float_to_bf16_bits(rng.standard_normal((1, H, 512)).astype(np.float32))
out = sparsemla.sparse_decode(q, cache, idx, ptr, main_block_size=BS, path="cpu")
want, _, a = sparsemla.sparse_decode_reference(q, cache, idx, ptr, main_block_size=BS,
                                               return_abs_mean=True)
v = sparsemla.verify_decode_output(out, want, a)
assert v["passed"], v["summary"]

if has_cuda:
    import ctypes
    try:
        ctypes.CDLL("libcuda.so.1")
        driver = True
    except OSError:
        driver = False
    try:
        plan = sparsemla.plan_decode(1, H, 128, device="cuda:0")
    except sparsemla.Error as e:
        assert "CUDA" in str(e), e
        print("CUDA call without a GPU:", e)
    else:
        assert driver, "a CUDA call succeeded without a driver"
        print("a CUDA device is present:", plan)
print("standalone import OK, cuda" if has_cuda else "standalone import OK, cpu-only")
"""


def main():
    so, has_cuda = pathlib.Path(sys.argv[1]), sys.argv[2].upper() in ("ON", "1", "TRUE")
    failures = []
    dyn = subprocess.run(["readelf", "-d", str(so)], check=True, capture_output=True,
                         text=True).stdout
    for line in dyn.splitlines():
        if "(NEEDED)" in line and any(lib in line for lib in TOOLKIT_LIBS):
            failures.append(f"needs a CUDA toolkit library: {line.strip()}")
        if ("(RPATH)" in line or "(RUNPATH)" in line) and "cuda" in line.lower():
            failures.append(f"search path into a CUDA toolkit: {line.strip()}")
    ldd = subprocess.run(["ldd", str(so)], check=True, capture_output=True, text=True).stdout
    for line in ldd.splitlines():
        if "not found" in line or any(lib in line for lib in TOOLKIT_LIBS):
            failures.append(f"ldd: {line.strip()}")

    env = {k: v for k, v in os.environ.items()
           if k not in ("LD_LIBRARY_PATH", "CUDA_HOME", "CUDA_PATH", "PYTHONPATH")}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep)
                                  if "cuda" not in p.lower())
    env["PYTHONPATH"] = str(so.parent.parent)
    env["SPARSEMLA_NO_TORCH"] = "1"
    r = subprocess.run([sys.executable, "-c", CHILD, "1" if has_cuda else "0"], env=env,
                       cwd=so.parent.parent, capture_output=True, text=True, timeout=240)
    print(r.stdout, end="")
    if r.returncode != 0:
        failures.append(f"the import/decode in a toolkit-free environment failed:\n{r.stderr}")
    if failures:
        print("\n".join(failures), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
