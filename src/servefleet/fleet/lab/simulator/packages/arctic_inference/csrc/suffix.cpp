// arctic_inference.suffix_decoding._C: a SIMULATION for the servefleet lab. Like the real
// extension it is C++20 and needs a compiler and the Python headers to build.
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <concepts>

template <std::integral T>
consteval T tree_depth() { return 24; }

static PyObject* max_tree_depth(PyObject*, PyObject*) {
    return PyLong_FromLong(tree_depth<long>());
}

static PyMethodDef methods[] = {
    {"max_tree_depth", max_tree_depth, METH_NOARGS, "the compiled default tree depth"},
    {nullptr, nullptr, 0, nullptr},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, methods};

PyMODINIT_FUNC PyInit__C(void) { return PyModule_Create(&module); }
