// Makes vllm_volta_fp4._C importable as a Python module; loading it runs the TORCH_LIBRARY registrations of the
// csrc/*.cu files, which define the ops under torch.ops.volta_fp4.
#include <Python.h>

PyMODINIT_FUNC PyInit__C(void) {
  static PyModuleDef module = {PyModuleDef_HEAD_INIT, "_C", "CUDA kernels of vllm-volta-fp4 (torch.ops.volta_fp4)", -1,
                               nullptr};
  return PyModule_Create(&module);
}
