import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # kernels.py

# The assert_close table compares against torch's layer_norm on one CPU code path
# (assert_close_table.py says why); set before any test module imports torch.
os.environ.setdefault("ATEN_CPU_CAPABILITY", "avx2")
