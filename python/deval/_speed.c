/* SPDX-License-Identifier: MIT */
/*
 * deval._speed: the plain gather of the Python binding, in C.
 *
 * An evaluation loop calls gather_for_metrics((logits, preds, labels)) once per batch, on a
 * few hundred bytes; through ctypes, describing the inputs and building the results cost
 * about 7 us a tensor, more than the collective itself. This module does that part for the
 * plain case: CPU torch tensors and numpy arrays, C-contiguous, of deval's dtypes, alone or
 * in one flat tuple, list or dict. For anything else it returns None and the binding's
 * general path (which also names what is wrong with an input) takes the call; nothing has
 * been sent then. Results are copied once out of shared memory into new arrays of the
 * input's kind, as the general path does.
 *
 * It does not link libdeval: the binding hands it the entry points of the libdeval it
 * loaded, so that a process holds one libdeval whatever the paths, and each dtype's size as
 * that libdeval's deval_dtype_size() tells it. It uses only CPython's stable calls and the
 * buffer protocol, not numpy's or torch's C API, and keeps no state but what configure() and
 * configure_torch() set once. The GIL is released while a rank
 * waits for the others; the inputs and the keys of a dict are held until their copy.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "deval.h"

/* DLPack's ABI (a stable public struct layout), for torch results without numpy's help. */
typedef struct DLDevice {
        int32_t device_type; /* 1: CPU */
        int32_t device_id;
} DLDevice;
typedef struct DLDataType {
        uint8_t code; /* 0 int, 1 uint, 2 float, 4 bfloat, 6 bool */
        uint8_t bits;
        uint16_t lanes;
} DLDataType;
typedef struct DLTensor {
        void *data;
        DLDevice device;
        int32_t ndim;
        DLDataType dtype;
        int64_t *shape;
        int64_t *strides;
        uint64_t byte_offset;
} DLTensor;
typedef struct DLManagedTensor {
        DLTensor dl_tensor;
        void *manager_ctx;
        void (*deleter)(struct DLManagedTensor *self);
} DLManagedTensor;

typedef int (*GatherFn)(deval_group *g, int n, const deval_tensor in[],
                        const deval_gather_opts *opts, deval_tensor out[]);

/* What the binding configured: borrowed for the life of the process (held references). */
static struct {
        PyObject *ndarray;     /* numpy.ndarray */
        PyObject *np_empty;    /* numpy.empty */
        PyObject *np_codes;    /* {numpy dtype: deval dtype} */
        PyObject *np_raw;      /* (numpy dtype by deval dtype), bfloat16 as int16 for torch */
        PyObject *tensor;      /* torch.Tensor, once torch is imported */
        PyObject *torch_codes; /* {torch dtype: deval dtype} */
        PyObject *from_numpy;  /* torch.from_numpy */
        PyObject *from_dlpack; /* torch's DLPack capsule consumer; NULL: through numpy */
        PyObject *bfloat16;    /* torch.bfloat16 */
        PyObject *malformed;   /* deval.ProtocolError(msg, status) */
        PyObject *torch_setup; /* called with torch once it is imported: configure_torch() */
        PyObject *s_dtype, *s_shape, *s_data_ptr, *s_is_contiguous, *s_is_cpu, *s_view, *s_is_neg;
} S;

enum { /* deval.h's dtype numbers: the last one, and bfloat16 (whose bits numpy lacks) */
        DTYPE_MAX = DEVAL_F64,
        DTYPE_BFLOAT16 = DEVAL_BF16
};
/* Bytes of one element by deval dtype: libdeval's deval_dtype_size(), given to configure(). */
static int64_t dtype_size[DTYPE_MAX + 1];

/* One input: its descriptor's source and what its result is made as. */
typedef struct Leaf {
        PyObject *obj;  /* held during the call */
        PyObject *kind; /* the numpy dtype of a numpy input (borrowed from obj); NULL: torch */
        Py_buffer view; /* a numpy input's buffer, released after the call */
        bool has_view;
        int code;
} Leaf;

typedef struct Call {
        Leaf leaf[DEVAL_MAX_TENSORS];
        deval_tensor in[DEVAL_MAX_TENSORS];
        deval_tensor out[DEVAL_MAX_TENSORS];
        PyObject *keys[DEVAL_MAX_TENSORS]; /* a dict's keys, held, in the leaves' order */
        int own[DEVAL_MAX_TENSORS];        /* a dict's leaf of its j-th key, in its order */
        uint64_t names;                    /* deval_gather_opts.names of a dict; 0: none */
        int n;
} Call;

/*
 * A dict's values are leaves in the order of its keys where they are all strings (_nest's
 * _items(), the one rule): ranks whose dicts hold the same keys in another order (built from
 * a set, say) pair each tensor with the one of its name. own[j] is the leaf of the dict's
 * j-th key; items[] (n of them) become the values in the leaves' order. Returns 1; 0 where a
 * key is not a string (the general path names the tensors); -1 with an exception set.
 */
static int dict_leaves(PyObject *x, Py_ssize_t n, PyObject **keys, PyObject **items, int *own) {
        Py_ssize_t pos = 0;
        PyObject *k, *v;
        bool strs = true;
        for (Py_ssize_t j = 0; j < n && PyDict_Next(x, &pos, &k, &v); j++) {
                keys[j] = k;
                items[j] = v;
                own[j] = (int)j;
                strs = strs && PyUnicode_CheckExact(k);
        }
        if (!strs)
                return 0;
        int at[DEVAL_MAX_TENSORS];
        for (Py_ssize_t j = 0; j < n; j++)
                at[j] = (int)j;
        for (Py_ssize_t j = 1; j < n; j++) { /* (an insertion sort: n <= 16) */
                for (Py_ssize_t i = j; i > 0; i--) {
                        int c = PyUnicode_Compare(keys[at[i - 1]], keys[at[i]]);
                        if (c == -1 && PyErr_Occurred())
                                return -1;
                        if (c <= 0)
                                break;
                        int t = at[i];
                        at[i] = at[i - 1];
                        at[i - 1] = t;
                }
        }
        PyObject *k2[DEVAL_MAX_TENSORS], *v2[DEVAL_MAX_TENSORS];
        for (Py_ssize_t i = 0; i < n; i++) {
                k2[i] = keys[at[i]];
                v2[i] = items[at[i]];
                own[at[i]] = (int)i;
        }
        memcpy(keys, k2, (size_t)n * sizeof(*keys));
        memcpy(items, v2, (size_t)n * sizeof(*items));
        return 1;
}

/*
 * deval_gather_opts.names of a flat dict whose keys (n, in the leaves' order) are strings,
 * as _nest's names_of() digests any structure: FNV-1a over each key's UTF-8 bytes, a 0 and a
 * 2 (a leaf's end). Returns 0 with an exception set.
 */
static uint64_t dict_names(PyObject *const *keys, Py_ssize_t n) {
        uint64_t h = 0xcbf29ce484222325ull;
        for (Py_ssize_t i = 0; i < n; i++) {
                Py_ssize_t len;
                const char *s = PyUnicode_AsUTF8AndSize(keys[i], &len);
                if (!s)
                        return 0;
                for (Py_ssize_t b = 0; b <= len + 1; b++) {
                        h ^= b < len ? (uint8_t)s[b] : b == len ? 0 : 2;
                        h *= 0x100000001b3ull;
                }
        }
        return h ? h : 1;
}

static void call_release(Call *c) {
        for (int i = 0; i < c->n; i++) {
                if (c->leaf[i].has_view)
                        PyBuffer_Release(&c->leaf[i].view);
                Py_XDECREF(c->leaf[i].obj);
                Py_XDECREF(c->keys[i]);
        }
        c->n = 0;
}

/* A dtype's code from one of the tables; 0: not one of deval's. */
static int code_of(PyObject *table, PyObject *dtype) {
        PyObject *v = PyDict_GetItemWithError(table, dtype);
        if (!v)
                return PyErr_Occurred() ? -1 : 0;
        long code = PyLong_AsLong(v);
        return code >= 1 && code <= DTYPE_MAX ? (int)code : 0;
}

static int describe_numpy(PyObject *v, Leaf *l, deval_tensor *t) {
        PyObject *dtype = PyObject_GetAttr(v, S.s_dtype);
        if (!dtype)
                return -1;
        int code = code_of(S.np_codes, dtype);
        Py_DECREF(dtype); /* the array holds its dtype */
        if (code <= 0)
                return code;
        /* (a non-contiguous array refuses a C-contiguous view: the general path copies it) */
        if (PyObject_GetBuffer(v, &l->view, PyBUF_C_CONTIGUOUS) < 0) {
                PyErr_Clear();
                return 0;
        }
        l->has_view = true;
        if (l->view.ndim > DEVAL_MAX_DIMS || l->view.itemsize != dtype_size[code])
                return 0;
        l->kind = dtype;
        t->data = l->view.len ? l->view.buf : NULL;
        t->ndim = l->view.ndim;
        for (int d = 0; d < l->view.ndim; d++)
                t->shape[d] = l->view.shape[d];
        return code;
}

/* A Python int from a call or attribute of a tensor, as int64; false with an error set. */
static bool as_i64(PyObject *o, int64_t *ret) {
        if (!o)
                return false;
        long long x = PyLong_AsLongLong(o);
        Py_DECREF(o);
        if (x == -1 && PyErr_Occurred())
                return false;
        *ret = x;
        return true;
}

static int describe_torch(PyObject *v, Leaf *l, deval_tensor *t) {
        PyObject *o = PyObject_GetAttr(v, S.s_is_cpu);
        if (!o)
                return -1;
        bool cpu = o == Py_True;
        Py_DECREF(o);
        if (!cpu)
                return 0;
        o = PyObject_CallMethodNoArgs(v, S.s_is_contiguous);
        if (!o)
                return -1;
        bool contiguous = o == Py_True;
        Py_DECREF(o);
        if (!contiguous)
                return 0;
        /* torch's negative bit (z.conj().imag): its memory holds the values negated */
        o = PyObject_CallMethodNoArgs(v, S.s_is_neg);
        if (!o)
                return -1;
        bool neg = o == Py_True;
        Py_DECREF(o);
        if (neg)
                return 0;
        o = PyObject_GetAttr(v, S.s_dtype);
        if (!o)
                return -1;
        int code = code_of(S.torch_codes, o);
        Py_DECREF(o);
        if (code <= 0)
                return code;
        PyObject *shape = PyObject_GetAttr(v, S.s_shape); /* torch.Size: a tuple */
        if (!shape)
                return -1;
        Py_ssize_t nd = PyTuple_Check(shape) ? PyTuple_GET_SIZE(shape) : -1;
        if (nd < 0 || nd > DEVAL_MAX_DIMS) {
                Py_DECREF(shape);
                return 0;
        }
        t->ndim = (int32_t)nd;
        for (Py_ssize_t d = 0; d < nd; d++) {
                t->shape[d] = PyLong_AsLongLong(PyTuple_GET_ITEM(shape, d));
                if (t->shape[d] == -1 && PyErr_Occurred()) {
                        Py_DECREF(shape);
                        return -1;
                }
        }
        Py_DECREF(shape);
        int64_t ptr;
        if (!as_i64(PyObject_CallMethodNoArgs(v, S.s_data_ptr), &ptr))
                return -1;
        t->data = (void *)(uintptr_t)ptr;
        l->kind = NULL;
        return code;
}

/*
 * Describe every input of the call into c; the leaves come from x: a tuple, a list, a dict
 * (its values) or one tensor. Returns 1 when the call is plain, 0 when it is not (the
 * general path takes it), -1 with an exception set.
 */
static int call_describe(Call *c, PyObject *x, bool per_sample) {
        PyObject *single[1] = {x};
        PyObject **items = single;
        Py_ssize_t n = 1;
        if (PyTuple_CheckExact(x) || PyList_CheckExact(x)) {
                items = PySequence_Fast_ITEMS(x);
                n = PySequence_Fast_GET_SIZE(x);
        }
        PyObject *dkeys[DEVAL_MAX_TENSORS], *dvals[DEVAL_MAX_TENSORS];
        bool dict = PyDict_CheckExact(x);
        if (dict) {
                n = PyDict_GET_SIZE(x);
                if (n < 1 || n > DEVAL_MAX_TENSORS)
                        return 0;
                int named = dict_leaves(x, n, dkeys, dvals, c->own);
                if (named <= 0)
                        return named;
                if (!(c->names = dict_names(dkeys, n)))
                        return -1;
                items = dvals;
        }
        if (n < 1 || n > DEVAL_MAX_TENSORS)
                return 0;
        int64_t rows = -1;
        for (int i = 0; i < n; i++) {
                PyObject *v = items[i], *key = dict ? dkeys[i] : NULL;
                Leaf *l = &c->leaf[i];
                deval_tensor *t = &c->in[i];
                memset(l, 0, sizeof(*l));
                memset(t, 0, sizeof(*t));
                t->device = -1;
                Py_INCREF(v);
                l->obj = v;
                c->keys[i] = key;
                Py_XINCREF(key);
                c->n = i + 1;
                int code;
                if (Py_TYPE(v) == (PyTypeObject *)S.ndarray)
                        code = describe_numpy(v, l, t);
                else if (S.tensor && PyObject_TypeCheck(v, (PyTypeObject *)S.tensor))
                        code = describe_torch(v, l, t);
                else
                        code = 0;
                if (code <= 0)
                        return code;
                l->code = t->dtype = code;
                if (per_sample) { /* one sample dim, the same rows: else the general path names it */
                        if (t->ndim == 0 || (rows >= 0 && t->shape[0] != rows))
                                return 0;
                        rows = t->shape[0];
                }
        }
        return 1;
}

static PyObject *shape_tuple(const deval_tensor *t) {
        PyObject *shape = PyTuple_New(t->ndim);
        if (!shape)
                return NULL;
        for (int d = 0; d < t->ndim; d++) {
                PyObject *v = PyLong_FromLongLong(t->shape[d]);
                if (!v) {
                        Py_DECREF(shape);
                        return NULL;
                }
                PyTuple_SET_ITEM(shape, d, v);
        }
        return shape;
}

/* The bytes of a result as libdeval described it; -1 (with ProtocolError's status) if its
 * descriptor is not one a gather of this input can give. */
static int64_t result_bytes(const deval_tensor *out, int code) {
        if (out->dtype != code || out->ndim < 0 || out->ndim > DEVAL_MAX_DIMS)
                return -1;
        int64_t n = dtype_size[code];
        for (int d = 0; d < out->ndim; d++) {
                if (out->shape[d] < 0 || __builtin_mul_overflow(n, out->shape[d], &n))
                        return -1;
        }
        if (n > 0 && !out->data)
                return -1;
        return n;
}

/* Raise ProtocolError for a result libdeval should never have described. */
static void malformed(const deval_tensor *out, int code, int i) {
        PyObject *msg = PyUnicode_FromFormat("deval: a malformed result for tensor %d (dtype %d "
                                             "for %d, %d dims)",
                                             i, (int)out->dtype, code, (int)out->ndim);
        if (!msg)
                return;
        PyObject *e = PyObject_CallFunction(S.malformed, "Oi", msg, DEVAL_EPROTO);
        Py_DECREF(msg);
        if (e) {
                PyErr_SetObject((PyObject *)Py_TYPE(e), e);
                Py_DECREF(e);
        }
}

static const DLDataType dl_dtype[] = {
        {0, 0, 0},  {6, 8, 1},  {1, 8, 1},  {0, 8, 1},  {0, 16, 1}, {0, 32, 1},
        {0, 64, 1}, {2, 16, 1}, {4, 16, 1}, {2, 32, 1}, {2, 64, 1},
};

/* A torch result's memory: its DLPack description, then the bytes, one allocation freed when
 * torch drops the tensor (or the capsule, unused). */
typedef struct Owned {
        DLManagedTensor m;
        int64_t shape[DEVAL_MAX_DIMS];
        int64_t strides[DEVAL_MAX_DIMS];
        _Alignas(64) unsigned char data[];
} Owned;

static void owned_free(DLManagedTensor *m) {
        free(m); /* m is the first member of its Owned */
}

static void capsule_free(PyObject *cap) {
        /* torch renames a capsule it took ("used_dltensor") and frees the memory itself */
        if (PyCapsule_IsValid(cap, "dltensor"))
                owned_free(PyCapsule_GetPointer(cap, "dltensor"));
}

/* A torch tensor holding a copy of out's nbytes, through a DLPack capsule. */
static PyObject *result_dlpack(int code, const deval_tensor *out, int64_t nbytes) {
        size_t size = sizeof(Owned) + (size_t)nbytes;
        size = (size + 63) / 64 * 64;
        Owned *o = aligned_alloc(64, size);
        if (!o)
                return PyErr_NoMemory();
        memset(&o->m, 0, sizeof(o->m));
        int64_t stride = 1;
        for (int d = out->ndim - 1; d >= 0; d--) {
                o->shape[d] = out->shape[d];
                o->strides[d] = stride;
                stride *= out->shape[d] > 0 ? out->shape[d] : 1;
        }
        memcpy(o->data, out->data, (size_t)nbytes);
        o->m.dl_tensor = (DLTensor){.data = o->data,
                                    .device = {1, 0},
                                    .ndim = out->ndim,
                                    .dtype = dl_dtype[code],
                                    .shape = o->shape,
                                    .strides = o->strides};
        o->m.deleter = owned_free;
        PyObject *cap = PyCapsule_New(&o->m, "dltensor", capsule_free);
        if (!cap) {
                free(o);
                return NULL;
        }
        PyObject *t = PyObject_CallOneArg(S.from_dlpack, cap);
        Py_DECREF(cap); /* frees o unless torch took it */
        return t;
}

/* One result: a new array of the input's kind holding a copy of out's bytes. */
static PyObject *result_new(const Leaf *l, const deval_tensor *out, int64_t nbytes) {
        if (!l->kind && S.from_dlpack)
                return result_dlpack(l->code, out, nbytes);
        PyObject *shape = shape_tuple(out);
        if (!shape)
                return NULL;
        PyObject *dtype = l->kind ? l->kind : PyTuple_GET_ITEM(S.np_raw, l->code);
        PyObject *args[2] = {shape, dtype};
        PyObject *a = PyObject_Vectorcall(S.np_empty, args, 2, NULL);
        Py_DECREF(shape);
        if (!a)
                return NULL;
        if (nbytes > 0) {
                Py_buffer b;
                if (PyObject_GetBuffer(a, &b, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) {
                        Py_DECREF(a);
                        return NULL;
                }
                if (b.len != nbytes) {
                        PyBuffer_Release(&b);
                        Py_DECREF(a);
                        PyErr_SetString(PyExc_SystemError, "deval: a result of the wrong size");
                        return NULL;
                }
                memcpy(b.buf, out->data, (size_t)nbytes);
                PyBuffer_Release(&b);
        }
        if (l->kind)
                return a;
        PyObject *t = PyObject_CallOneArg(S.from_numpy, a);
        Py_DECREF(a);
        if (t && l->code == DTYPE_BFLOAT16) { /* int16 bits, seen as bfloat16 */
                PyObject *bf = PyObject_CallMethodOneArg(t, S.s_view, S.bfloat16);
                Py_DECREF(t);
                t = bf;
        }
        return t;
}

/* The results in the structure of x. */
static PyObject *call_results(Call *c, PyObject *x) {
        PyObject *res[DEVAL_MAX_TENSORS];
        int n = c->n;
        for (int i = 0; i < n; i++) {
                int64_t nbytes = result_bytes(&c->out[i], c->leaf[i].code);
                res[i] = nbytes < 0 ? NULL : result_new(&c->leaf[i], &c->out[i], nbytes);
                if (!res[i]) {
                        for (int j = 0; j < i; j++)
                                Py_DECREF(res[j]);
                        if (nbytes < 0)
                                malformed(&c->out[i], c->leaf[i].code, i);
                        return NULL;
                }
        }
        PyObject *r;
        if (PyTuple_CheckExact(x) || PyList_CheckExact(x)) {
                r = PyTuple_CheckExact(x) ? PyTuple_New(n) : PyList_New(n);
                for (int i = 0; i < n; i++) {
                        if (!r)
                                Py_DECREF(res[i]);
                        else if (PyTuple_Check(r))
                                PyTuple_SET_ITEM(r, i, res[i]);
                        else
                                PyList_SET_ITEM(r, i, res[i]);
                }
                return r;
        }
        if (PyDict_CheckExact(x)) { /* (in the dict's own order) */
                r = PyDict_New();
                for (int j = 0; j < n; j++) {
                        int i = c->own[j];
                        if (r && PyDict_SetItem(r, c->keys[i], res[i]) < 0)
                                Py_CLEAR(r);
                }
                for (int i = 0; i < n; i++)
                        Py_DECREF(res[i]);
                return r;
        }
        return res[0];
}

/*
 * gather(fn, handle, x, opts, per_sample) -> results, None or a status
 *
 * fn: the address of deval_gather or deval_gather_for_metrics; handle: the deval_group's
 * address (0 for a group left: None); opts: the address of a deval_gather_opts kept alive
 * by the caller. Returns the results in x's structure; None when x is not plain (nothing
 * was sent); a nonzero int: the call's status, for the binding to raise with
 * deval_errmsg().
 */
static PyObject *speed_gather(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
        (void)self;
        if (nargs != 5) {
                PyErr_SetString(PyExc_TypeError, "gather() takes 5 arguments");
                return NULL;
        }
        GatherFn fn = (GatherFn)PyLong_AsVoidPtr(args[0]);
        deval_group *g = PyLong_AsVoidPtr(args[1]);
        const deval_gather_opts *opts = PyLong_AsVoidPtr(args[3]);
        int per_sample = PyObject_IsTrue(args[4]);
        if (PyErr_Occurred() || per_sample < 0)
                return NULL;
        if (!fn || !g || !opts || !S.ndarray)
                Py_RETURN_NONE;
        if (!S.tensor) { /* torch imported since the last call: the binding tells us of it */
                PyObject *torch = PyDict_GetItemString(PyImport_GetModuleDict(), "torch");
                PyObject *r = torch ? PyObject_CallOneArg(S.torch_setup, torch) : Py_None;
                if (!r)
                        return NULL;
                if (torch)
                        Py_DECREF(r);
        }
        /* on the stack, not allocated per call; only what describe fills is read */
        Call call, *c = &call;
        c->n = 0;
        c->names = 0;
        PyObject *r = NULL;
        int plain = call_describe(c, args[2], per_sample);
        if (plain == 0) {
                Py_INCREF(Py_None);
                r = Py_None;
        } else if (plain > 0) {
                int status;
                deval_gather_opts named; /* (the caller's are shared: a copy of them, named) */
                if (c->names) {
                        memcpy(&named, opts, sizeof(named));
                        named.names = c->names;
                        opts = &named;
                }
                Py_BEGIN_ALLOW_THREADS;
                status = fn(g, c->n, c->in, opts, c->out);
                Py_END_ALLOW_THREADS;
                r = status ? PyLong_FromLong(status) : call_results(c, args[2]);
        }
        call_release(c);
        return r;
}

/* configure(ndarray, empty, np_codes, np_raw, malformed, torch_setup, sizes): once at
 * import; sizes: deval_dtype_size() of each deval dtype, 0 first. */
static PyObject *speed_configure(PyObject *self, PyObject *args) {
        (void)self;
        PyObject *ndarray, *empty, *codes, *raw, *bad, *setup, *sizes;
        if (!PyArg_ParseTuple(args, "O!OO!O!OOO!", &PyType_Type, &ndarray, &empty, &PyDict_Type,
                              &codes, &PyTuple_Type, &raw, &bad, &setup, &PyTuple_Type, &sizes))
                return NULL;
        if (PyTuple_GET_SIZE(raw) != DTYPE_MAX + 1) {
                PyErr_SetString(PyExc_ValueError, "np_raw: one dtype for each deval dtype");
                return NULL;
        }
        if (PyTuple_GET_SIZE(sizes) != DTYPE_MAX + 1) {
                PyErr_SetString(PyExc_ValueError, "sizes: one size for each deval dtype");
                return NULL;
        }
        int64_t size[DTYPE_MAX + 1];
        for (int c = 0; c <= DTYPE_MAX; c++) {
                size[c] = PyLong_AsLongLong(PyTuple_GET_ITEM(sizes, c));
                if (size[c] == -1 && PyErr_Occurred())
                        return NULL;
                if (size[c] < 0 || size[c] > 16) {
                        PyErr_SetString(PyExc_ValueError, "sizes: not a dtype's size");
                        return NULL;
                }
        }
        memcpy(dtype_size, size, sizeof(size));
        Py_XSETREF(S.ndarray, (Py_INCREF(ndarray), ndarray));
        Py_XSETREF(S.np_empty, (Py_INCREF(empty), empty));
        Py_XSETREF(S.np_codes, (Py_INCREF(codes), codes));
        Py_XSETREF(S.np_raw, (Py_INCREF(raw), raw));
        Py_XSETREF(S.malformed, (Py_INCREF(bad), bad));
        Py_XSETREF(S.torch_setup, (Py_INCREF(setup), setup));
        Py_RETURN_NONE;
}

/* configure_torch(Tensor, codes, from_numpy, bfloat16, from_dlpack): torch's part, once it is
 * imported; from_dlpack None: results through numpy and from_numpy. */
static PyObject *speed_configure_torch(PyObject *self, PyObject *args) {
        (void)self;
        PyObject *tensor, *codes, *from_numpy, *bf16, *from_dlpack;
        if (!PyArg_ParseTuple(args, "O!O!OOO", &PyType_Type, &tensor, &PyDict_Type, &codes,
                              &from_numpy, &bf16, &from_dlpack))
                return NULL;
        Py_XSETREF(S.from_dlpack,
                   from_dlpack == Py_None ? NULL : (Py_INCREF(from_dlpack), from_dlpack));
        Py_XSETREF(S.torch_codes, (Py_INCREF(codes), codes));
        Py_XSETREF(S.from_numpy, (Py_INCREF(from_numpy), from_numpy));
        Py_XSETREF(S.bfloat16, (Py_INCREF(bf16), bf16));
        Py_XSETREF(S.tensor, (Py_INCREF(tensor), tensor)); /* last: it enables the torch path */
        Py_RETURN_NONE;
}

static PyMethodDef speed_methods[] = {
        {"gather", (PyCFunction)(void (*)(void))speed_gather, METH_FASTCALL,
         "gather(fn, handle, x, opts, per_sample) -> results, None (not plain) or a status"},
        {"configure", speed_configure, METH_VARARGS,
         "configure(ndarray, empty, np_codes, np_raw, malformed, torch_setup, sizes)"},
        {"configure_torch", speed_configure_torch, METH_VARARGS,
         "configure_torch(Tensor, codes, from_numpy, bfloat16, from_dlpack)"},
        {NULL, NULL, 0, NULL},
};

static struct PyModuleDef speed_module = {
        PyModuleDef_HEAD_INIT,
        "_speed",
        "deval's plain gather in C; used by the binding, not an API of its own.",
        -1,
        speed_methods,
        NULL,
        NULL,
        NULL,
        NULL,
};

PyMODINIT_FUNC PyInit__speed(void) {
        static const char *const names[] = {"dtype",  "shape", "data_ptr", "is_contiguous",
                                            "is_cpu", "view",  "is_neg"};
        PyObject **interned[] = {&S.s_dtype,  &S.s_shape, &S.s_data_ptr, &S.s_is_contiguous,
                                 &S.s_is_cpu, &S.s_view,  &S.s_is_neg};
        for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
                if (!*interned[i] && !(*interned[i] = PyUnicode_InternFromString(names[i])))
                        return NULL;
        }
        return PyModule_Create(&speed_module);
}
