// vllm_volta_fp4._C of the wheel (Python's limited API: one binary for every CPython ≥ 3.9). Importing it runs the
// STABLE_TORCH_LIBRARY registrations (torch.ops.volta_fp4); kernel_origin tells where a device's kernels come from.
#define Py_LIMITED_API 0x03090000
#include <Python.h>

#include "driver/cuda_driver.h"

namespace {

PyObject* kernel_origin(PyObject*, PyObject* arg) {
  const long device = PyLong_AsLong(arg);
  if (device == -1 && PyErr_Occurred()) return nullptr;
  return PyUnicode_FromString(volta_fp4::driver::kernel_origin(int(device)).c_str());
}

PyMethodDef methods[] = {
    {"kernel_origin", kernel_origin, METH_O, "Where device N's kernels come from (shipped sm_70 code, PTX JIT, or why missing)."},
    {nullptr, nullptr, 0, nullptr}};

}  // namespace

PyMODINIT_FUNC PyInit__C(void) {
  static PyModuleDef module = {PyModuleDef_HEAD_INIT, "_C", "kernels of vllm-volta-fp4 (driver-API build)", -1,
                               methods};
  return PyModule_Create(&module);
}
