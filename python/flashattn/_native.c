/*
 * flashattn._native: the Python binding of the C API. Tensors come in through DLPack without a
 * copy (strides honoured), outputs are written into caller-given DLPack tensors or allocated here
 * in the backend's memory and handed out as DLPack capsules. Framework glue (which from_dlpack to
 * call, torch's streams) lives in the Python package; this file only speaks DLPack and C.
 *
 * Ownership rules (ASan/refcount): every capsule we consume is renamed "used_dltensor" and its
 * deleter called exactly once, in release_input(); every capsule we produce calls its deleter from
 * the capsule destructor unless a consumer renamed it, per the DLPack protocol.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <flashattn.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ---- DLPack ABI (dlpack.h 1.0): the versioned capsule "dltensor_versioned" (read-only flag) and
 * the unversioned "dltensor" of older producers and consumers. */
typedef struct { int32_t device_type, device_id; } DLDevice;
typedef struct { uint8_t code, bits; uint16_t lanes; } DLDataType;
typedef struct {
    void *data;
    DLDevice device;
    int32_t ndim;
    DLDataType dtype;
    int64_t *shape, *strides; /* strides in elements; NULL = compact row-major */
    uint64_t byte_offset;
} DLTensor;
typedef struct DLManagedTensor {
    DLTensor dl_tensor;
    void *manager_ctx;
    void (*deleter)(struct DLManagedTensor *self);
} DLManagedTensor;

typedef struct { uint32_t major, minor; } DLPackVersion;
typedef struct DLManagedTensorVersioned {
    DLPackVersion version;
    void *manager_ctx;
    void (*deleter)(struct DLManagedTensorVersioned *self);
    uint64_t flags;
    DLTensor dl_tensor;
} DLManagedTensorVersioned;
#define DLPACK_FLAG_READ_ONLY ((uint64_t)1 << 0)

enum { kDLCPU = 1, kDLCUDA = 2, kDLCUDAHost = 3, kDLROCM = 10, kDLCUDAManaged = 13 };
enum { kDLInt = 0, kDLUInt = 1, kDLFloat = 2, kDLBfloat = 4, kDLBool = 6 };
/* DLPack 1.1's FP8 type codes (PyTorch >= 2.6 exports float8_e4m3fn / float8_e5m2 as these). */
enum { kDLFloat8_e4m3fn = 10, kDLFloat8_e5m2 = 12 };

/* flashattn._errors classes, looked up once at import. */
static PyObject *error_classes[6]; /* indexed by fa_status */
static PyObject *type_error_class;  /* InvalidTypeError: a tensor of the wrong kind */

#define MAX_DEVICES 64
static fa_context *contexts[4][MAX_DEVICES]; /* per backend and device, for the process's life */

/* Raises cls(message, status): the flashattn.Error constructor's arguments. */
static PyObject *raise_as(PyObject *cls, fa_status status, const char *message)
{
    PyObject *args = Py_BuildValue("(si)", message, (int)status);
    if (args) {
        PyErr_SetObject(cls, args);
        Py_DECREF(args);
    }
    return NULL;
}

static PyObject *raise_status(fa_status status, const char *message)
{
    return raise_as((status > 0 && status < 6) ? error_classes[status] : error_classes[FA_ERROR_BACKEND_FAILURE],
                    status, message);
}

static PyObject *raise_last_error(fa_status status) { return raise_status(status, fa_last_error()); }

/* FA_ERROR_INVALID_VALUE found here, before the C API saw the call: as_type picks
 * InvalidTypeError (a tensor of the wrong kind) over InvalidValueError. */
__attribute__((format(printf, 2, 3))) static PyObject *raise_invalid(int as_type, const char *fmt, ...)
{
    char message[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(message, sizeof message, fmt, ap);
    va_end(ap);
    return raise_as(as_type ? type_error_class : error_classes[FA_ERROR_INVALID_VALUE], FA_ERROR_INVALID_VALUE,
                    message);
}
#define raise_type(...) raise_invalid(1, __VA_ARGS__)
#define raise_value(...) raise_invalid(0, __VA_ARGS__)

/* ---- consuming inputs ---------------------------------------------------------------------- */
typedef struct {
    PyObject *capsule;              /* owned reference, NULL when empty */
    DLManagedTensor *mt;            /* ours once the capsule is renamed (unversioned) */
    DLManagedTensorVersioned *vmt;  /* or this (versioned) */
    const DLTensor *tensor;         /* the view inside either */
    int read_only;
} dl_input;

static void release_input(dl_input *in)
{
    if (in->mt && in->mt->deleter) in->mt->deleter(in->mt);
    if (in->vmt && in->vmt->deleter) in->vmt->deleter(in->vmt);
    in->mt = NULL;
    in->vmt = NULL;
    in->tensor = NULL;
    Py_CLEAR(in->capsule);
}

static PyObject *max_version_kwargs; /* {"max_version": (1, 0)} */

/* obj.__dlpack__(stream=..., max_version=(1, 0)), or without max_version for producers that
 * predate DLPack 1.0 (they raise TypeError for the unknown keyword). */
static PyObject *call_dlpack(PyObject *method, PyObject *stream)
{
    PyObject *args = PyTuple_New(0), *kwargs = PyDict_Copy(max_version_kwargs), *capsule = NULL;
    if (args && kwargs && (stream == Py_None || PyDict_SetItemString(kwargs, "stream", stream) == 0)) {
        capsule = PyObject_Call(method, args, kwargs);
        if (!capsule && PyErr_ExceptionMatches(PyExc_TypeError)) {
            PyErr_Clear();
            PyDict_DelItemString(kwargs, "max_version");
            capsule = PyObject_Call(method, args, kwargs);
        }
    }
    Py_XDECREF(args);
    Py_XDECREF(kwargs);
    return capsule;
}

/* obj: a DLPack capsule or an object with __dlpack__ (called with stream= when stream is not None). */
static int take_input(PyObject *obj, const char *name, PyObject *stream, dl_input *in)
{
    memset(in, 0, sizeof *in);
    if (PyCapsule_CheckExact(obj)) {
        Py_INCREF(obj);
        in->capsule = obj;
    } else {
        PyObject *method = PyObject_GetAttrString(obj, "__dlpack__");
        if (!method) {
            PyErr_Clear();
            raise_type("%s: %s is not a DLPack tensor (it has no __dlpack__)", name, Py_TYPE(obj)->tp_name);
            return -1;
        }
        in->capsule = call_dlpack(method, stream);
        Py_DECREF(method);
        if (!in->capsule) return -1;
    }
    if (PyCapsule_IsValid(in->capsule, "dltensor_versioned")) {
        DLManagedTensorVersioned *vmt = PyCapsule_GetPointer(in->capsule, "dltensor_versioned");
        if (vmt->version.major != 1) {
            Py_CLEAR(in->capsule); /* unconsumed: its destructor frees it */
            raise_type("%s: DLPack version %u.%u is not supported (1.x)", name, vmt->version.major, vmt->version.minor);
            return -1;
        }
        if (PyCapsule_SetName(in->capsule, "used_dltensor_versioned") < 0) {
            Py_CLEAR(in->capsule);
            return -1;
        }
        in->vmt = vmt;
        in->tensor = &vmt->dl_tensor;
        in->read_only = (vmt->flags & DLPACK_FLAG_READ_ONLY) != 0;
    } else if (PyCapsule_IsValid(in->capsule, "dltensor")) {
        DLManagedTensor *mt = PyCapsule_GetPointer(in->capsule, "dltensor");
        if (PyCapsule_SetName(in->capsule, "used_dltensor") < 0) {
            Py_CLEAR(in->capsule);
            return -1;
        }
        in->mt = mt;
        in->tensor = &mt->dl_tensor;
    } else {
        Py_CLEAR(in->capsule);
        raise_type("%s: __dlpack__ did not return an unused DLPack capsule", name);
        return -1;
    }
    return 0;
}

static const char *dtype_name(DLDataType t, char *buf, size_t size)
{
    if (t.lanes == 1 && t.bits == 8 && t.code == kDLFloat8_e4m3fn) return "float8_e4m3fn";
    if (t.lanes == 1 && t.bits == 8 && t.code == kDLFloat8_e5m2) return "float8_e5m2";
    const char *kind = t.code == kDLFloat ? "float" : t.code == kDLBfloat ? "bfloat" : t.code == kDLInt ? "int"
                     : t.code == kDLUInt ? "uint" : t.code == kDLBool ? "bool" : "code";
    snprintf(buf, size, "%s%u%s", kind, (unsigned)t.bits, t.lanes != 1 ? "xN" : "");
    return buf;
}

/* With cache set (a KV cache's k or v) the quantised element types are accepted too: int8
 * (FA_DTYPE_I8) and DLPack's float8_e4m3fn / float8_e5m2. */
static int to_fa_dtype_as(const DLTensor *t, const char *name, int cache, fa_dtype *out)
{
    DLDataType d = t->dtype;
    if (d.lanes == 1 && d.code == kDLFloat && d.bits == 32) *out = FA_DTYPE_F32;
    else if (d.lanes == 1 && d.code == kDLFloat && d.bits == 16) *out = FA_DTYPE_F16;
    else if (d.lanes == 1 && d.code == kDLBfloat && d.bits == 16) *out = FA_DTYPE_BF16;
    else if (cache && d.lanes == 1 && d.code == kDLInt && d.bits == 8) *out = FA_DTYPE_I8;
    else if (cache && d.lanes == 1 && d.code == kDLFloat8_e4m3fn && d.bits == 8) *out = FA_DTYPE_FP8_E4M3;
    else if (cache && d.lanes == 1 && d.code == kDLFloat8_e5m2 && d.bits == 8) *out = FA_DTYPE_FP8_E5M2;
    else {
        char buf[32];
        raise_type(cache ? "%s: dtype %s is not supported (float32, float16, bfloat16, int8, float8_e4m3fn or "
                           "float8_e5m2)"
                         : "%s: dtype %s is not supported (float32, float16 or bfloat16)",
                   name, dtype_name(d, buf, sizeof buf));
        return -1;
    }
    return 0;
}

static int to_fa_dtype(const DLTensor *t, const char *name, fa_dtype *out) { return to_fa_dtype_as(t, name, 0, out); }

static fa_backend backend_of_device(int32_t device_type)
{
    switch (device_type) {
    case kDLCPU: case kDLCUDAHost: return FA_BACKEND_CPU;
    case kDLCUDA: case kDLCUDAManaged: return FA_BACKEND_CUDA;
    case kDLROCM: return FA_BACKEND_HIP;
    default: return FA_BACKEND_AUTO;
    }
}

/* A [batch, seqlen, heads, head_dim] tensor, or with packed set a packed-batch (varlen) tensor
 * [total_tokens, heads, head_dim], read as batch 1. Size-1 dimensions take their packed stride
 * (their stride never matters and frameworks report any value); zero or negative strides are
 * refused here, because the C API reads all-zero strides as "packed". */
static int to_fa_tensor_as(const DLTensor *t, const char *name, int packed, int cache, fa_tensor *out)
{
    const int ndim = packed ? 3 : 4;
    if (t->ndim != ndim)
        return raise_value(packed ? "%s: has %d dimensions, expected 3 [total_tokens, heads, head_dim] (packed batch)"
                                  : "%s: has %d dimensions, expected 4 [batch, seqlen, heads, head_dim]",
                           name, (int)t->ndim), -1;
    if (to_fa_dtype_as(t, name, cache, &out->dtype) < 0) return -1;
    static const char *dim_names[4] = {"batch", "seqlen", "heads", "head_dim"};
    /* The 4-d view: a packed tensor gains a leading batch of 1. */
    int64_t shape[4], given_strides[4], packed_strides[4], strides[4];
    const int lead = 4 - ndim;
    for (int i = 0; i < 4; ++i) {
        shape[i] = i < lead ? 1 : t->shape[i - lead];
        given_strides[i] = i < lead || !t->strides ? 0 : t->strides[i - lead];
    }
    /* Before anything is allocated from these sizes (an output shaped like q): a negative size or an
     * element count past 64 bits is no tensor. */
    int64_t count = t->dtype.bits / 8 ? t->dtype.bits / 8 : 1;
    for (int i = 0; i < 4; ++i) {
        if (shape[i] < 0)
            return raise_value("%s: %s %lld is negative", name, packed && i == 1 ? "total_tokens" : dim_names[i],
                               (long long)shape[i]), -1;
        if (__builtin_mul_overflow(count, shape[i], &count))
            return raise_value("%s: element count overflows 64 bits", name), -1;
    }
    packed_strides[3] = 1;
    for (int i = 2; i >= 0; --i) packed_strides[i] = packed_strides[i + 1] * (shape[i + 1] > 0 ? shape[i + 1] : 1);
    for (int i = 0; i < 4; ++i) {
        strides[i] = (i < lead || !t->strides || shape[i] == 1) ? packed_strides[i] : given_strides[i];
        if (strides[i] <= 0 && shape[i] > 1)
            return raise_value("%s: stride %lld of dimension %s is not positive (broadcast or reversed views are "
                               "not supported; make the tensor contiguous)", name, (long long)strides[i],
                               packed && i == 1 ? "total_tokens" : dim_names[i]), -1;
    }
    if (strides[3] != 1)
        return raise_value("%s: head_dim stride is %lld; the last dimension must be contiguous", name,
                           (long long)strides[3]), -1;
    out->data = (char *)t->data + t->byte_offset;
    out->batch = shape[0];
    out->seqlen = shape[1];
    out->heads = shape[2];
    out->head_dim = shape[3];
    out->stride_batch = strides[0];
    out->stride_seq = strides[1];
    out->stride_head = strides[2];
    return 0;
}

static int to_fa_tensor(const DLTensor *t, const char *name, int packed, fa_tensor *out)
{
    return to_fa_tensor_as(t, name, packed, 0, out);
}

static int same_device(const DLTensor *t, const DLTensor *ref, const char *name)
{
    if (t->device.device_type == ref->device.device_type && t->device.device_id == ref->device.device_id) return 0;
    raise_value("%s: is on device (%d, %d), q on (%d, %d); all tensors must be on one device", name,
                (int)t->device.device_type, (int)t->device.device_id, (int)ref->device.device_type,
                (int)ref->device.device_id);
    return -1;
}

/* lse: float32 [batch, heads_q, seqlen_q], or [heads_q, total_q] for a packed batch (FlashAttention-2's
 * varlen layout), contiguous (the C API takes a bare pointer). */
static int check_lse(const DLTensor *t, const char *name, const fa_tensor *q, int packed, float **out)
{
    int64_t want[3] = {q->batch, q->heads, q->seqlen};
    const int ndim = packed ? 2 : 3;
    const int64_t *w = want + (3 - ndim);
    int shape_ok = t->ndim == ndim;
    for (int i = 0; shape_ok && i < ndim; ++i) shape_ok = t->shape[i] == w[i];
    if (!shape_ok) {
        if (packed)
            return raise_value("%s: expected shape [%lld, %lld] (heads_q, total_q)", name, (long long)w[0],
                               (long long)w[1]), -1;
        return raise_value("%s: expected shape [%lld, %lld, %lld] (batch, heads_q, seqlen_q)", name, (long long)want[0],
                           (long long)want[1], (long long)want[2]), -1;
    }
    if (t->dtype.code != kDLFloat || t->dtype.bits != 32 || t->dtype.lanes != 1)
        return raise_type("%s: dtype must be float32", name), -1;
    if (((uintptr_t)t->data + t->byte_offset) % sizeof(float) != 0) /* the C API reads it as float * */
        return raise_value("%s: is not aligned to 4-byte floats", name), -1;
    int64_t expected = 1;
    for (int i = ndim - 1; t->strides && i >= 0; --i) {
        if (w[i] > 1 && t->strides[i] != expected) return raise_value("%s: must be contiguous", name), -1;
        expected *= w[i];
    }
    *out = (float *)((char *)t->data + t->byte_offset);
    return 0;
}

/* ---- producing outputs ----------------------------------------------------------------------- */
/* An output allocated here. It leaves as a "flashattn.output" capsule; _native.export() turns
 * that into one DLPack capsule of the kind the consumer asked for, which then owns the memory. */
typedef struct {
    DLManagedTensor mt;            /* the unversioned view */
    DLManagedTensorVersioned vmt;  /* the versioned view: same tensor, writable */
    int64_t shape[4];
    fa_context *ctx;               /* memory from fa_malloc on ctx; NULL = malloc */
} exported;

static void free_exported(exported *e)
{
    if (e->ctx) fa_free(e->ctx, e->mt.dl_tensor.data);
    else free(e->mt.dl_tensor.data);
    free(e);
}

static void exported_deleter(DLManagedTensor *mt) { free_exported(mt->manager_ctx); }
static void exported_versioned_deleter(DLManagedTensorVersioned *vmt) { free_exported(vmt->manager_ctx); }

static void dlpack_capsule_destructor(PyObject *capsule)
{
    /* Renamed to used_*: consumed, the consumer calls the deleter. */
    if (PyCapsule_IsValid(capsule, "dltensor")) {
        DLManagedTensor *mt = PyCapsule_GetPointer(capsule, "dltensor");
        mt->deleter(mt);
    } else if (PyCapsule_IsValid(capsule, "dltensor_versioned")) {
        DLManagedTensorVersioned *vmt = PyCapsule_GetPointer(capsule, "dltensor_versioned");
        vmt->deleter(vmt);
    }
}

/* The pending capsule's context is set once its output has been handed to a DLPack capsule. */
static void pending_capsule_destructor(PyObject *capsule)
{
    if (!PyCapsule_GetContext(capsule)) free_exported(PyCapsule_GetPointer(capsule, "flashattn.output"));
}

static DLDataType dl_dtype(fa_dtype d)
{
    DLDataType t = {d == FA_DTYPE_BF16 ? kDLBfloat : kDLFloat, d == FA_DTYPE_F32 ? 32 : 16, 1};
    return t;
}

/* A packed tensor of `ndim` dimensions in ctx's memory (or malloc'd host memory when ctx is NULL). */
static exported *new_output(fa_context *ctx, DLDevice device, DLDataType dtype, int ndim, const int64_t *shape)
{
    exported *e = calloc(1, sizeof *e);
    if (!e) return (exported *)PyErr_NoMemory();
    size_t bytes = dtype.bits / 8;
    for (int i = 0; i < ndim; ++i) {
        e->shape[i] = shape[i];
        bytes *= (size_t)shape[i];
    }
    void *data = NULL;
    if (ctx) {
        fa_status st = fa_malloc(ctx, bytes ? bytes : 1, &data);
        if (st != FA_SUCCESS) {
            free(e);
            return (exported *)raise_last_error(st);
        }
    } else if (!(data = malloc(bytes ? bytes : 1))) {
        free(e);
        return (exported *)PyErr_NoMemory();
    }
    e->ctx = ctx;
    e->mt.dl_tensor = (DLTensor){data, device, ndim, dtype, e->shape, NULL, 0};
    e->mt.manager_ctx = e;
    e->mt.deleter = exported_deleter;
    e->vmt.version = (DLPackVersion){1, 0};
    e->vmt.manager_ctx = e;
    e->vmt.deleter = exported_versioned_deleter;
    e->vmt.dl_tensor = e->mt.dl_tensor;
    return e;
}

/* Wraps an output into a pending capsule, which then owns it (also on failure). */
static PyObject *export_output(exported *e)
{
    PyObject *capsule = PyCapsule_New(e, "flashattn.output", pending_capsule_destructor);
    if (!capsule) free_exported(e);
    return capsule;
}

static void discard_output(exported *e)
{
    if (e) free_exported(e);
}

/* export(pending, versioned) -> a "dltensor_versioned" or "dltensor" capsule owning the output. */
static PyObject *py_export(PyObject *self, PyObject *args)
{
    PyObject *pending;
    int versioned;
    if (!PyArg_ParseTuple(args, "O!p", &PyCapsule_Type, &pending, &versioned)) return NULL;
    exported *e = PyCapsule_GetPointer(pending, "flashattn.output");
    if (!e) return NULL;
    if (PyCapsule_GetContext(pending)) {
        PyErr_SetString(PyExc_BufferError, "flashattn: this output was already exported");
        return NULL;
    }
    PyObject *capsule = versioned ? PyCapsule_New(&e->vmt, "dltensor_versioned", dlpack_capsule_destructor)
                                  : PyCapsule_New(&e->mt, "dltensor", dlpack_capsule_destructor);
    if (capsule && PyCapsule_SetContext(pending, e) < 0) { /* pending no longer owns e */
        PyCapsule_SetName(capsule, "flashattn.failed"); /* so its destructor leaves e alone */
        Py_CLEAR(capsule);
    }
    return capsule;
}

/* ---- contexts -------------------------------------------------------------------------------- */
static fa_context *context_for(fa_backend backend, int device)
{
    if (device < 0 || device >= MAX_DEVICES)
        return (fa_context *)raise_value("device: index %d is outside [0, %d)", device, MAX_DEVICES);
    fa_context **slot = &contexts[backend][device];
    if (!*slot) {
        fa_status st = fa_context_create(backend, device, slot);
        if (st != FA_SUCCESS) {
            *slot = NULL;
            return (fa_context *)raise_last_error(st);
        }
    }
    return *slot;
}

#define N_OPTION_ARGS 16
enum { OPTION_ALIBI_SLOPES = 12, OPTION_SINKS, OPTION_BIAS, OPTION_VARLEN };

/* ---- option parsing shared by forward and backward ------------------------------------------- */
typedef struct {
    fa_attention_desc desc;
    int32_t *seqlens_k;
    Py_ssize_t seqlens_k_count;
    dl_input block_mask_input;
    fa_block_mask block_mask;
    fa_bias bias, dbias;             /* desc.bias points at bias when a bias is given */
    const DLTensor *bias_tensor;     /* the bias's DLPack view (owned by the call's inputs) */
    PyObject *cu_seqlens_q, *cu_seqlens_k; /* packed batch: borrowed; bound once q is (bind_varlen) */
    fa_varlen varlen;                /* desc.varlen points here for a packed batch */
} options;

static void release_options(options *o)
{
    free(o->seqlens_k);
    o->seqlens_k = NULL;
    release_input(&o->block_mask_input);
}

/* args: scale, causal, window_left, window_right, seqlens_k, dropout_p, seed, offset,
 * block_mask, block_q, block_k, softcap, alibi_slopes, sinks, bias, varlen. varlen: None or
 * (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k), a packed batch. seqlens_k: None or a sequence
 * of ints; block_mask: None or a host uint8/bool DLPack tensor [rows, cols], contiguous. The
 * modifier tensors (alibi_slopes, sinks, bias) live on q's device: bind_modifiers() takes them. */
static int parse_options(PyObject *const *args, options *o)
{
    memset(o, 0, sizeof *o);
    fa_attention_desc_init(&o->desc); /* by name only: the struct may grow a size field */
    double scale = PyFloat_AsDouble(args[0]);
    int causal = PyObject_IsTrue(args[1]);
    long wl = PyLong_AsLong(args[2]), wr = PyLong_AsLong(args[3]);
    double p = PyFloat_AsDouble(args[5]);
    unsigned long long seed = PyLong_AsUnsignedLongLongMask(args[6]);
    unsigned long long offset = PyLong_AsUnsignedLongLongMask(args[7]);
    long bq = PyLong_AsLong(args[9]), bk = PyLong_AsLong(args[10]);
    double softcap = PyFloat_AsDouble(args[11]);
    if (PyErr_Occurred() || causal < 0) return -1;
    if (wl < INT32_MIN || wl > INT32_MAX || wr < INT32_MIN || wr > INT32_MAX)
        return raise_value("window: (%ld, %ld) does not fit in 32 bits", wl, wr), -1;
    if (bq < 1 || bq > INT32_MAX || bk < 1 || bk > INT32_MAX)
        return raise_value("block_size: (%ld, %ld) must be positive 32-bit sizes", bq, bk), -1;
    o->desc.softmax_scale = (float)scale;
    o->desc.causal = causal;
    o->desc.window_left = (int32_t)wl;
    o->desc.window_right = (int32_t)wr;
    o->desc.dropout_p = (float)p;
    o->desc.dropout_seed = seed;
    o->desc.dropout_offset = offset;
    o->desc.softcap = (float)softcap; /* its range is the C API's to check */
    if (args[4] != Py_None) {
        PyObject *seq = PySequence_Fast(args[4], "seqlens_k: must be None or a sequence of ints");
        if (!seq) return -1;
        Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
        o->seqlens_k = malloc((size_t)(n ? n : 1) * sizeof *o->seqlens_k);
        if (!o->seqlens_k) {
            Py_DECREF(seq);
            PyErr_NoMemory();
            return -1;
        }
        for (Py_ssize_t i = 0; i < n; ++i) {
            long long x = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(seq, i));
            if (x == -1 && PyErr_Occurred()) {
                Py_DECREF(seq);
                return -1;
            }
            /* Out of range values are the C API's to report; clamp into int32 so they stay out of range. */
            o->seqlens_k[i] = x > INT32_MAX ? INT32_MAX : x < INT32_MIN ? INT32_MIN : (int32_t)x;
        }
        Py_DECREF(seq);
        o->desc.seqlens_k = o->seqlens_k;
        o->seqlens_k_count = n;
    }
    if (args[8] != Py_None) {
        if (take_input(args[8], "block_mask", Py_None, &o->block_mask_input) < 0) return -1;
        const DLTensor *t = o->block_mask_input.tensor;
        if (backend_of_device(t->device.device_type) != FA_BACKEND_CPU)
            return raise_value("block_mask: must be in host memory"), -1;
        if (t->ndim != 2) return raise_value("block_mask: has %d dimensions, expected 2 [rows, cols]", (int)t->ndim), -1;
        if (t->dtype.bits != 8 || t->dtype.lanes != 1 || (t->dtype.code != kDLUInt && t->dtype.code != kDLBool))
            return raise_type("block_mask: dtype must be uint8 or bool"), -1;
        if (t->strides && !((t->shape[1] == 1 || t->strides[1] == 1) && (t->shape[0] == 1 || t->strides[0] == t->shape[1])))
            return raise_value("block_mask: must be contiguous"), -1;
        o->block_mask.block_q = (int32_t)bq;
        o->block_mask.block_k = (int32_t)bk;
        o->block_mask.rows = t->shape[0];
        o->block_mask.cols = t->shape[1];
        o->block_mask.mask = (const uint8_t *)t->data + t->byte_offset;
        o->desc.block_mask = &o->block_mask;
    }
    if (args[OPTION_VARLEN] != Py_None) {
        PyObject *v = args[OPTION_VARLEN];
        if (!PyTuple_Check(v) || PyTuple_GET_SIZE(v) != 4)
            return raise_value("varlen: must be (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)"), -1;
        long long max_q = PyLong_AsLongLong(PyTuple_GET_ITEM(v, 2)), max_k = PyLong_AsLongLong(PyTuple_GET_ITEM(v, 3));
        if (PyErr_Occurred()) return -1;
        o->cu_seqlens_q = PyTuple_GET_ITEM(v, 0);
        o->cu_seqlens_k = PyTuple_GET_ITEM(v, 1);
        o->varlen.max_seqlen_q = max_q; /* its range is the C API's to check */
        o->varlen.max_seqlen_k = max_k;
        o->desc.varlen = &o->varlen;
    }
    return 0;
}

static const char *shape_text(const DLTensor *t, char *buf, size_t size);

/* ---- one attention call ---------------------------------------------------------------------- */
#define MAX_TENSORS 26 /* forward_kvcache: 7 tensors, 3 modifiers, 6 tables (lengths, pages, slots, offsets),
                          4 scales, 2 rotary tables */
#define MAX_TEMPS 8    /* int32 tables copied from Python ints: at most 5 in one call (forward_kvcache) */
typedef struct {
    dl_input fixed_inputs[MAX_TENSORS];
    dl_input *inputs;            /* fixed_inputs, or a larger array (merge_partials) */
    int n_inputs, max_inputs;
    exported *made[MAX_TENSORS]; /* outputs allocated here, exported on success */
    int n_made;
    void *temps[MAX_TEMPS];      /* int32 tables copied from Python ints, in the context's memory */
    int n_temps;
    int packed;                  /* a packed (varlen) batch: tensors are [total_tokens, heads, head_dim] */
    int64_t extent[4];           /* the scores' [batch, heads_q, seqlen_q, seqlen_k], for the modifiers */
    const DLTensor *device_ref;  /* q's DLPack view: every tensor must share its device */
    PyObject *stream;            /* DLPack stream number for __dlpack__, or None */
    fa_context *ctx;
    fa_backend backend;
    options opts;
} call;

static void init_call(call *c, PyObject *stream)
{
    memset(c, 0, sizeof *c);
    c->inputs = c->fixed_inputs;
    c->max_inputs = MAX_TENSORS;
    c->stream = stream;
}

static void release_call(call *c)
{
    for (int i = 0; i < c->n_inputs; ++i) release_input(&c->inputs[i]);
    for (int i = 0; i < c->n_made; ++i) discard_output(c->made[i]);
    if (c->n_temps && c->backend != FA_BACKEND_CPU) fa_synchronize(c->ctx); /* a kernel may still read them */
    for (int i = 0; i < c->n_temps; ++i) {
        if (c->backend == FA_BACKEND_CPU) free(c->temps[i]);
        else fa_free(c->ctx, c->temps[i]);
    }
    if (c->inputs != c->fixed_inputs) free(c->inputs);
    c->inputs = c->fixed_inputs;
    c->n_inputs = c->n_made = c->n_temps = 0;
    release_options(&c->opts);
}

static const DLTensor *bind_input(call *c, PyObject *obj, const char *name)
{
    if (c->n_inputs == c->max_inputs) return (const DLTensor *)raise_value("%s: too many tensors in one call", name);
    dl_input *in = &c->inputs[c->n_inputs];
    if (take_input(obj, name, c->stream, in) < 0) return NULL;
    c->n_inputs++;
    const DLTensor *t = in->tensor;
    if (c->device_ref && same_device(t, c->device_ref, name) < 0) return NULL;
    return t;
}

static int bind_tensor(call *c, PyObject *obj, const char *name, fa_tensor *t)
{
    const DLTensor *dl = bind_input(c, obj, name);
    return dl ? to_fa_tensor(dl, name, c->packed, t) : -1;
}

/* A 4-d tensor (a KV cache: [batch or pages, capacity or page_size, heads_kv, head_dim]) whatever
 * the call's layout, which may be written to when writable is set. code >= 0: the fa_dtype of a
 * quantised cache (FA_DTYPE_I8 or FP8) that may come as raw uint8 bytes, for frameworks whose DLPack
 * export has no float8 type; a tensor of that type itself is accepted too. */
static int bind_cache_tensor(call *c, PyObject *obj, const char *name, int writable, long code, fa_tensor *t)
{
    const DLTensor *dl = bind_input(c, obj, name);
    if (!dl) return -1;
    DLTensor view = *dl;
    if (code >= 0) {
        static const uint8_t dl_codes[6] = {0, 0, 0, kDLInt, kDLFloat8_e4m3fn, kDLFloat8_e5m2};
        if (code < FA_DTYPE_I8 || code > FA_DTYPE_FP8_E5M2)
            return raise_value("%s: dtype code %ld is not a quantised cache's (3 int8, 4 float8_e4m3fn, 5 float8_e5m2)",
                               name, code), -1;
        const DLDataType want = {dl_codes[code], 8, 1};
        const int raw = dl->dtype.code == kDLUInt && dl->dtype.bits == 8 && dl->dtype.lanes == 1;
        const int same = dl->dtype.code == want.code && dl->dtype.bits == 8 && dl->dtype.lanes == 1;
        if (!raw && !same) {
            char buf[32], wbuf[32];
            return raise_type("%s: dtype %s given as the bytes of %s (uint8 or that dtype expected)", name,
                              dtype_name(dl->dtype, buf, sizeof buf), dtype_name(want, wbuf, sizeof wbuf)), -1;
        }
        view.dtype = want;
    }
    if (to_fa_tensor_as(&view, name, 0, 1, t) < 0) return -1;
    if (writable && c->inputs[c->n_inputs - 1].read_only) return raise_value("%s: is read-only", name), -1;
    return 0;
}

/* The caller's tensor, or a new packed one shaped like `like` in the context's memory. */
static int bind_output(call *c, PyObject *obj, const char *name, const fa_tensor *like, fa_tensor *t)
{
    if (obj != Py_None) {
        if (bind_tensor(c, obj, name, t) < 0) return -1;
        return c->inputs[c->n_inputs - 1].read_only ? (raise_value("%s: is read-only", name), -1) : 0;
    }
    int64_t shape[4] = {like->batch, like->seqlen, like->heads, like->head_dim};
    exported *e = new_output(c->ctx, c->device_ref->device, dl_dtype(like->dtype), 4 - c->packed, shape + c->packed);
    if (!e) return -1;
    c->made[c->n_made++] = e;
    *t = *like;
    t->data = e->mt.dl_tensor.data;
    t->stride_batch = t->stride_seq = t->stride_head = 0;
    return 0;
}

/* The caller's lse (written to when writable is set), or a new one in the context's memory. */
static int bind_lse(call *c, PyObject *obj, const char *name, int writable, const fa_tensor *q, float **lse)
{
    if (obj != Py_None) {
        const DLTensor *dl = bind_input(c, obj, name);
        if (!dl || check_lse(dl, name, q, c->packed, lse) < 0) return -1;
        return writable && c->inputs[c->n_inputs - 1].read_only ? (raise_value("%s: is read-only", name), -1) : 0;
    }
    int64_t shape[3] = {q->batch, q->heads, q->seqlen};
    exported *e = new_output(c->ctx, c->device_ref->device, dl_dtype(FA_DTYPE_F32), 3 - c->packed, shape + c->packed);
    if (!e) return -1;
    c->made[c->n_made++] = e;
    *lse = e->mt.dl_tensor.data;
    return 0;
}

/* An int32 table the C API reads from the context's memory (cu_seqlens, cache_seqlens,
 * block_table): a DLPack int32 tensor on q's device, contiguous, of `ndim` dimensions (shape[i] >= 0:
 * that size is required; < 0: any, written back), or, for one dimension, a Python sequence of ints
 * (or with scalar_ok an int, repeated shape[0] times), copied into the context's memory. */
static int bind_int32_table(call *c, PyObject *obj, const char *name, int ndim, int64_t *shape, int scalar_ok,
                            const int32_t **out)
{
    char text[96];
    if (!PyObject_HasAttrString(obj, "__dlpack__") && !PyCapsule_CheckExact(obj)) {
        if (ndim != 1) return raise_type("%s: must be an int32 tensor", name), -1;
        PyObject *seq = NULL;
        long long scalar = 0;
        Py_ssize_t n;
        if (scalar_ok && PyIndex_Check(obj)) { /* an int, or an integer scalar such as numpy.int32(5) */
            PyObject *index = PyNumber_Index(obj);
            if (!index) return -1;
            scalar = PyLong_AsLongLong(index);
            Py_DECREF(index);
            if (scalar == -1 && PyErr_Occurred()) return -1;
            n = shape[0];
        } else {
            if (!(seq = PySequence_Fast(obj, ""))) {
                PyErr_Clear();
                return raise_type("%s: %s is not an int32 tensor or a sequence of ints", name, Py_TYPE(obj)->tp_name), -1;
            }
            n = PySequence_Fast_GET_SIZE(seq);
            if (shape[0] >= 0 && n != shape[0]) {
                Py_DECREF(seq);
                return raise_value("%s: has %zd entries, expected %lld", name, n, (long long)shape[0]), -1;
            }
        }
        int32_t *host = malloc((size_t)(n ? n : 1) * sizeof *host);
        if (!host) {
            Py_XDECREF(seq);
            return PyErr_NoMemory(), -1;
        }
        for (Py_ssize_t i = 0; i < n; ++i) {
            long long x = seq ? PyLong_AsLongLong(PySequence_Fast_GET_ITEM(seq, i)) : scalar;
            if (x == -1 && PyErr_Occurred()) {
                free(host);
                Py_XDECREF(seq);
                return -1;
            }
            if (x < INT32_MIN || x > INT32_MAX) {
                free(host);
                Py_XDECREF(seq);
                return raise_value("%s: entry %zd = %lld does not fit in int32", name, i, x), -1;
            }
            host[i] = (int32_t)x;
        }
        Py_XDECREF(seq);
        shape[0] = n;
        if (c->backend == FA_BACKEND_CPU) {
            c->temps[c->n_temps++] = host;
            *out = host;
            return 0;
        }
        void *device = NULL;
        fa_status st = fa_malloc(c->ctx, (size_t)(n ? n : 1) * sizeof *host, &device);
        if (st == FA_SUCCESS) {
            c->temps[c->n_temps++] = device;
            st = fa_memcpy_h2d(c->ctx, device, host, (size_t)n * sizeof *host);
        }
        free(host);
        if (st != FA_SUCCESS) return raise_last_error(st), -1;
        *out = device;
        return 0;
    }
    const DLTensor *t = bind_input(c, obj, name);
    if (!t) return -1;
    if (t->dtype.code != kDLInt || t->dtype.bits != 32 || t->dtype.lanes != 1) {
        char buf[32];
        return raise_type("%s: dtype %s is not supported (int32)", name, dtype_name(t->dtype, buf, sizeof buf)), -1;
    }
    int ok = t->ndim == ndim;
    for (int i = 0; ok && i < ndim; ++i) ok = shape[i] < 0 || t->shape[i] == shape[i];
    if (!ok) {
        size_t used = (size_t)snprintf(text, sizeof text, "[");
        for (int i = 0; i < ndim && used < sizeof text; ++i)
            used += shape[i] < 0 ? (size_t)snprintf(text + used, sizeof text - used, "%sany", i ? ", " : "")
                                 : (size_t)snprintf(text + used, sizeof text - used, "%s%lld", i ? ", " : "",
                                                    (long long)shape[i]);
        if (used < sizeof text) snprintf(text + used, sizeof text - used, "]");
        char got[96];
        return raise_value("%s: expected shape %s, got %s", name, text, shape_text(t, got, sizeof got)), -1;
    }
    if (((uintptr_t)t->data + t->byte_offset) % sizeof(int32_t) != 0) /* the C API reads it as int32_t * */
        return raise_value("%s: is not aligned to 4-byte ints", name), -1;
    int64_t expected = 1;
    for (int i = ndim - 1; i >= 0; --i) {
        if (t->strides && t->shape[i] > 1 && t->strides[i] != expected) return raise_value("%s: must be contiguous", name), -1;
        expected *= t->shape[i];
        shape[i] = t->shape[i];
    }
    *out = (const int32_t *)((const char *)t->data + t->byte_offset);
    return 0;
}

/* A packed batch's offsets, once q is bound: cu_seqlens_q and cu_seqlens_k of batch + 1 entries.
 * k_name names cu_seqlens_k in messages; with k_optional, None leaves it NULL (forward_kvcache:
 * no new tokens, or new tokens packed like q). */
static int bind_varlen(call *c, const char *k_name, int k_optional)
{
    options *o = &c->opts;
    if (!c->packed) return 0;
    int64_t n_q = -1;
    if (bind_int32_table(c, o->cu_seqlens_q, "cu_seqlens_q", 1, &n_q, 0, &o->varlen.cu_seqlens_q) < 0) return -1;
    if (n_q < 1) return raise_value("cu_seqlens_q: is empty; it holds batch + 1 offsets, the first 0"), -1;
    int64_t n_k = n_q;
    if (k_optional && o->cu_seqlens_k == Py_None) o->varlen.cu_seqlens_k = NULL;
    else if (bind_int32_table(c, o->cu_seqlens_k, k_name, 1, &n_k, 0, &o->varlen.cu_seqlens_k) < 0) return -1;
    o->varlen.batch = n_q - 1;
    return 0;
}


/* A float32 vector (or [rows, cols] matrix) of exactly these sizes, packed: the C API takes a bare pointer. */
static int check_f32_packed(const DLTensor *t, const char *name, int ndim, const int64_t *shape)
{
    if (t->dtype.code != kDLFloat || t->dtype.bits != 32 || t->dtype.lanes != 1) {
        char buf[32];
        return raise_type("%s: dtype %s is not supported (float32)", name, dtype_name(t->dtype, buf, sizeof buf)), -1;
    }
    if (((uintptr_t)t->data + t->byte_offset) % sizeof(float) != 0) /* the C API reads it as float * */
        return raise_value("%s: is not aligned to 4-byte floats", name), -1;
    int64_t expected = 1;
    for (int i = ndim - 1; i >= 0; --i) {
        if (t->strides && shape[i] > 1 && t->strides[i] != expected) return raise_value("%s: must be contiguous", name), -1;
        expected *= shape[i];
    }
    return 0;
}

/* "[2, 4]": t's shape for messages. */
static const char *shape_text(const DLTensor *t, char *buf, size_t size)
{
    size_t used = (size_t)snprintf(buf, size, "[");
    for (int i = 0; i < t->ndim && used < size; ++i)
        used += (size_t)snprintf(buf + used, size - used, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
    if (used < size) snprintf(buf + used, size - used, "]");
    return buf;
}

static int shape_is(const DLTensor *t, int ndim, const int64_t *shape)
{
    if (t->ndim != ndim) return 0;
    for (int i = 0; i < ndim; ++i)
        if (t->shape[i] != shape[i]) return 0;
    return 1;
}

/* A bias DLTensor broadcastable to [batch, heads_q, seqlen_q, seqlen_k] (numpy rules: missing
 * leading axes and size-1 axes broadcast, as do axes of stride 0) as an fa_bias. The key axis
 * cannot broadcast: the C API reads keys at stride 1. */
static int to_fa_bias(const DLTensor *t, const char *name, const int64_t target[4], fa_bias *out)
{
    static const char *axis_names[4] = {"batch", "heads_q", "seqlen_q", "seqlen_k"};
    if (t->ndim < 1 || t->ndim > 4)
        return raise_value("%s: has %d dimensions, expected 1 to 4 (broadcastable to [batch, heads_q, seqlen_q, "
                           "seqlen_k])", name, (int)t->ndim), -1;
    if (to_fa_dtype(t, name, &out->dtype) < 0) return -1;
    int64_t strides[4];
    int64_t packed = 1;
    for (int axis = 3; axis >= 0; --axis) {
        int d = axis - (4 - t->ndim);
        int64_t size = d >= 0 ? t->shape[d] : 1;
        int64_t stride = d < 0 ? 0 : t->strides ? t->strides[d] : packed;
        if (size != target[axis] && (size != 1 || axis == 3))
            return raise_value("%s: dimension %d has size %lld, which does not broadcast to %s = %lld%s", name, d,
                               (long long)size, axis_names[axis], (long long)target[axis],
                               axis == 3 ? " (the key axis cannot broadcast: expand it)" : ""), -1;
        if (d >= 0) packed *= size; /* once the size is known to be the target's or 1: no overflow */
        if (axis == 3) {
            if (size > 1 && stride != 1)
                return raise_value("%s: key-axis stride is %lld; it must be 1 (make the last dimension contiguous)",
                                   name, (long long)stride), -1;
            continue;
        }
        if (size == 1) stride = 0;
        if (stride < 0)
            return raise_value("%s: stride %lld of dimension %d is negative (reversed views are not supported)", name,
                               (long long)stride, d), -1;
        strides[axis] = stride;
    }
    out->data = (char *)t->data + t->byte_offset;
    out->stride_batch = strides[0];
    out->stride_head = strides[1];
    out->stride_q = strides[2];
    return 0;
}

/* The scores' extent [batch, heads_q, seqlen_q, seqlen_k] the modifiers index: a packed batch's
 * is [batch, heads_q, max_seqlen_q, max_seqlen_k]. */
static void set_extent(call *c, const fa_tensor *q, int64_t seqlen_k)
{
    c->extent[0] = c->packed ? c->opts.varlen.batch : q->batch;
    c->extent[1] = q->heads;
    c->extent[2] = c->packed ? c->opts.varlen.max_seqlen_q : q->seqlen;
    c->extent[3] = c->packed ? c->opts.varlen.max_seqlen_k : seqlen_k;
}

/* alibi_slopes ([heads_q] or [batch, heads_q]), sinks ([heads_q]) and bias, once set_extent() ran. */
static int bind_modifiers(call *c, PyObject *const *option_args)
{
    options *o = &c->opts;
    const long long batch = c->extent[0], heads = c->extent[1];
    if (option_args[OPTION_ALIBI_SLOPES] != Py_None) {
        const DLTensor *t = bind_input(c, option_args[OPTION_ALIBI_SLOPES], "alibi_slopes");
        if (!t) return -1;
        const int64_t per_head[1] = {heads}, per_batch[2] = {batch, heads};
        int batched = shape_is(t, 2, per_batch);
        char shape[96];
        if (!batched && !shape_is(t, 1, per_head))
            return raise_value("alibi_slopes: expected shape [%lld] (heads_q) or [%lld, %lld] (batch, heads_q), got %s",
                               heads, batch, heads,
                               shape_text(t, shape, sizeof shape)), -1;
        if (check_f32_packed(t, "alibi_slopes", batched ? 2 : 1, batched ? per_batch : per_head) < 0) return -1;
        o->desc.alibi_slopes = (const float *)((const char *)t->data + t->byte_offset);
        o->desc.alibi_per_batch = batched;
    }
    if (option_args[OPTION_SINKS] != Py_None) {
        const DLTensor *t = bind_input(c, option_args[OPTION_SINKS], "sinks");
        if (!t) return -1;
        const int64_t shape[1] = {heads};
        char text[96];
        if (!shape_is(t, 1, shape))
            return raise_value("sinks: expected shape [%lld] (heads_q), got %s", heads,
                               shape_text(t, text, sizeof text)), -1;
        if (check_f32_packed(t, "sinks", 1, shape) < 0) return -1;
        o->desc.sinks = (const float *)((const char *)t->data + t->byte_offset);
    }
    if (option_args[OPTION_BIAS] != Py_None) {
        const DLTensor *t = bind_input(c, option_args[OPTION_BIAS], "bias");
        if (!t || to_fa_bias(t, "bias", c->extent, &o->bias) < 0) return -1;
        o->desc.bias = &o->bias;
        o->bias_tensor = t;
    }
    return 0;
}

/* The first tensor is bound: its device picks the backend (an explicit backend must agree) and
 * the context, which runs on `stream`. */
static int select_backend(call *c, const char *first_name, PyObject *backend_obj)
{
    c->device_ref = c->inputs[0].tensor;
    long requested = PyLong_AsLong(backend_obj);
    if (requested == -1 && PyErr_Occurred()) return -1;
    c->backend = backend_of_device(c->device_ref->device.device_type);
    if (c->backend == FA_BACKEND_AUTO)
        return raise_value("%s: DLPack device type %d has no flashattn backend", first_name,
                           (int)c->device_ref->device.device_type), -1;
    if (requested != FA_BACKEND_AUTO && requested != (long)c->backend)
        return raise_value("backend: \"%s\" cannot run on tensors in %s memory", fa_backend_name((fa_backend)requested),
                           fa_backend_name(c->backend)), -1;
    c->ctx = context_for(c->backend, c->backend == FA_BACKEND_CPU ? 0 : c->device_ref->device.device_id);
    if (!c->ctx) return -1;
    if (c->backend != FA_BACKEND_CPU) {
        /* DLPack's CUDA stream 1 is the legacy default stream, which the C API calls NULL. */
        uintptr_t s = c->stream == Py_None ? 0 : (uintptr_t)PyLong_AsUnsignedLongLongMask(c->stream);
        if (PyErr_Occurred()) return -1;
        if (c->backend == FA_BACKEND_CUDA && s == 1) s = 0;
        fa_status st = fa_context_set_stream(c->ctx, (void *)s);
        if (st != FA_SUCCESS) return raise_last_error(st), -1;
    }
    return 0;
}

/* Options first (they say whether the batch is packed), then q, whose device picks the backend;
 * then a packed batch's offsets (bind_varlen). */
static int begin_call_as(call *c, PyObject *q_obj, fa_tensor *q, PyObject *const *option_args, PyObject *backend_obj,
                         PyObject *stream, const char *k_offsets_name, int k_offsets_optional)
{
    init_call(c, stream);
    if (parse_options(option_args, &c->opts) < 0) return -1;
    c->packed = c->opts.desc.varlen != NULL;
    if (bind_tensor(c, q_obj, "q", q) < 0) return -1;
    if (select_backend(c, "q", backend_obj) < 0) return -1;
    if (c->opts.desc.seqlens_k && c->opts.seqlens_k_count != q->batch)
        return raise_value("seqlens_k: has %zd entries, expected batch = %lld", c->opts.seqlens_k_count,
                           (long long)q->batch), -1;
    return bind_varlen(c, k_offsets_name, k_offsets_optional);
}

static int begin_call(call *c, PyObject *q_obj, fa_tensor *q, PyObject *const *option_args, PyObject *backend_obj,
                      PyObject *stream)
{
    return begin_call_as(c, q_obj, q, option_args, backend_obj, stream, "cu_seqlens_k", 0);
}

/* st = call: on the CPU without the GIL (a long computation; other Python threads go on); on a GPU
 * with it, since the call only queues work on the stream begin_call/select_backend set on the shared
 * context, which no other thread may change before the launch. */
#define RUN_API_CALL(c, st, call)              \
    do {                                       \
        if ((c)->backend == FA_BACKEND_CPU) {  \
            Py_BEGIN_ALLOW_THREADS             \
            (st) = (call);                     \
            Py_END_ALLOW_THREADS               \
        } else {                               \
            (st) = (call);                     \
        }                                      \
    } while (0)

/* After a successful run: outputs allocated here become capsules (the rest of the tuple: None). */
static PyObject *finish_call(call *c, fa_status st, const int *made_index, int n_results)
{
    /* New outputs may be read on any stream, and tables copied here are freed: wait for the kernels
     * (this also reports a device-side table check that failed). */
    if (st == FA_SUCCESS && (c->n_made || c->n_temps) && c->backend != FA_BACKEND_CPU) st = fa_synchronize(c->ctx);
    if (st != FA_SUCCESS) {
        raise_last_error(st);
        release_call(c);
        return NULL;
    }
    PyObject *result = PyTuple_New(n_results);
    for (int i = 0; result && i < n_results; ++i) {
        PyObject *item;
        if (made_index[i] < 0) {
            Py_INCREF(Py_None);
            item = Py_None;
        } else {
            exported *e = c->made[made_index[i]];
            c->made[made_index[i]] = NULL; /* the capsule owns it now */
            item = export_output(e);
            if (!item) Py_CLEAR(result);
        }
        if (result) PyTuple_SET_ITEM(result, i, item);
    }
    release_call(c);
    return result;
}


/* forward(q, k, v, out, lse, want_lse, *options, backend, stream) -> (out | None, lse | None) */
static PyObject *py_forward(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 6 + N_OPTION_ARGS + 2) return PyErr_Format(PyExc_TypeError, "forward: takes %d arguments", 6 + N_OPTION_ARGS + 2);
    call c;
    fa_tensor q, k, v, out;
    float *lse = NULL;
    int made_index[2] = {-1, -1};
    if (begin_call(&c, args[0], &q, args + 6, args[6 + N_OPTION_ARGS], args[7 + N_OPTION_ARGS]) < 0) goto fail;
    if (bind_tensor(&c, args[1], "k", &k) < 0 || bind_tensor(&c, args[2], "v", &v) < 0) goto fail;
    set_extent(&c, &q, k.seqlen);
    if (bind_modifiers(&c, args + 6) < 0) goto fail;
    if (args[3] == Py_None) made_index[0] = c.n_made;
    if (bind_output(&c, args[3], "out", &q, &out) < 0) goto fail;
    int want_lse = PyObject_IsTrue(args[5]);
    if (want_lse < 0) goto fail;
    if (args[4] != Py_None || want_lse) {
        if (args[4] == Py_None) made_index[1] = c.n_made;
        if (bind_lse(&c, args[4], "lse", 1, &q, &lse) < 0) goto fail;
    }
    fa_status st;
    RUN_API_CALL(&c, st, fa_forward(c.ctx, &c.opts.desc, &q, &k, &v, &out, lse));
    return finish_call(&c, st, made_index, 2);
fail:
    release_call(&c);
    return NULL;
}

/* dsinks: None (not computed), True (allocated here) or a float32 [heads_q] tensor to write. */
static int bind_dsinks(call *c, PyObject *obj, const fa_tensor *q, float **dsinks, int *made_index)
{
    if (obj == Py_None) return 0;
    if (!c->opts.desc.sinks) return raise_value("dsinks: needs sinks"), -1;
    const int64_t shape[1] = {q->heads};
    if (obj == Py_True) {
        exported *e = new_output(c->ctx, c->device_ref->device, dl_dtype(FA_DTYPE_F32), 1, shape);
        if (!e) return -1;
        *made_index = c->n_made;
        c->made[c->n_made++] = e;
        *dsinks = e->mt.dl_tensor.data;
        return 0;
    }
    const DLTensor *t = bind_input(c, obj, "dsinks");
    if (!t) return -1;
    if (c->inputs[c->n_inputs - 1].read_only) return raise_value("dsinks: is read-only"), -1;
    char text[96];
    if (!shape_is(t, 1, shape))
        return raise_value("dsinks: expected shape [%lld] (heads_q), got %s", (long long)q->heads,
                           shape_text(t, text, sizeof text)), -1;
    if (check_f32_packed(t, "dsinks", 1, shape) < 0) return -1;
    *dsinks = (float *)((char *)t->data + t->byte_offset);
    return 0;
}

/* dbias: None (not computed), True (allocated here: the bias's shape with each broadcast axis of
 * size 1, the gradient summed over it) or a tensor with the bias's broadcast to write. */
static int bind_dbias(call *c, PyObject *obj, const fa_bias **dbias,
                      int *made_index)
{
    if (obj == Py_None) return 0;
    if (!c->opts.desc.bias) return raise_value("dbias: needs bias"), -1;
    const DLTensor *t;
    if (obj == Py_True) {
        const DLTensor *bias = c->opts.bias_tensor;
        int64_t shape[4];
        for (int i = 0; i < bias->ndim; ++i)
            shape[i] = (bias->shape[i] == 1 || (bias->strides && bias->strides[i] == 0 && i < bias->ndim - 1)) ? 1
                       : bias->shape[i];
        exported *e = new_output(c->ctx, c->device_ref->device, bias->dtype, bias->ndim, shape);
        if (!e) return -1;
        *made_index = c->n_made;
        c->made[c->n_made++] = e;
        t = &e->mt.dl_tensor;
    } else {
        if (!(t = bind_input(c, obj, "dbias"))) return -1;
        if (c->inputs[c->n_inputs - 1].read_only) return raise_value("dbias: is read-only"), -1;
    }
    if (to_fa_bias(t, "dbias", c->extent, &c->opts.dbias) < 0) return -1;
    *dbias = &c->opts.dbias;
    return 0;
}

/* backward(q, k, v, out, dout, lse, dq, dk, dv, dsinks, dbias, *options, backend, stream)
 * -> (dq, dk, dv, dsinks, dbias): capsules for what was allocated here, None for the rest. */
static PyObject *py_backward(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    enum { N_TENSOR_ARGS = 11 };
    if (nargs != N_TENSOR_ARGS + N_OPTION_ARGS + 2)
        return PyErr_Format(PyExc_TypeError, "backward: takes %d arguments", N_TENSOR_ARGS + N_OPTION_ARGS + 2);
    call c;
    fa_tensor q, k, v, out, dout, dq, dk, dv;
    float *lse = NULL, *dsinks = NULL;
    const fa_bias *dbias = NULL;
    int made_index[5] = {-1, -1, -1, -1, -1};
    PyObject *const *option_args = args + N_TENSOR_ARGS;
    if (begin_call(&c, args[0], &q, option_args, option_args[N_OPTION_ARGS], option_args[N_OPTION_ARGS + 1]) < 0)
        goto fail;
    if (bind_tensor(&c, args[1], "k", &k) < 0 || bind_tensor(&c, args[2], "v", &v) < 0 ||
        bind_tensor(&c, args[3], "out", &out) < 0 || bind_tensor(&c, args[4], "dout", &dout) < 0)
        goto fail;
    set_extent(&c, &q, k.seqlen);
    if (bind_modifiers(&c, option_args) < 0) goto fail;
    if (args[5] == Py_None) {
        raise_value("lse: is None (backward needs the forward's lse)");
        goto fail;
    }
    if (bind_lse(&c, args[5], "lse", 0, &q, &lse) < 0) goto fail;
    const fa_tensor *like[3] = {&q, &k, &v};
    fa_tensor *grads[3] = {&dq, &dk, &dv};
    static const char *names[3] = {"dq", "dk", "dv"};
    for (int i = 0; i < 3; ++i) {
        if (args[6 + i] == Py_None) made_index[i] = c.n_made;
        if (bind_output(&c, args[6 + i], names[i], like[i], grads[i]) < 0) goto fail;
    }
    if (bind_dsinks(&c, args[9], &q, &dsinks, &made_index[3]) < 0 ||
        bind_dbias(&c, args[10], &dbias, &made_index[4]) < 0)
        goto fail;
    fa_status st;
    RUN_API_CALL(&c, st,
                 fa_backward_ex(c.ctx, &c.opts.desc, &q, &k, &v, &out, &dout, lse, &dq, &dk, &dv, dsinks, dbias));
    return finish_call(&c, st, made_index, 5);
fail:
    release_call(&c);
    return NULL;
}

/* ---- quantised caches and rotary embeddings (fa_kv_scales, fa_rotary) ---------------------------- */
/* kv_quant: None or (k_dtype, v_dtype, k_scale, v_scale, k_descale, v_descale): the caches' fa_dtype
 * codes (-1: the tensor's own DLPack dtype; 3, 4, 5: int8, float8_e4m3fn, float8_e5m2, and the tensor
 * may be its raw uint8 bytes) and the scales of fa_kv_scales, each None or a packed float32 tensor on
 * q's device: k_scale / v_scale shaped like their cache without its last dimension (written on
 * append), k_descale / v_descale [batch, heads_kv]. rotary: None or (cos, sin, interleaved), float32
 * [max_position, rotary_dim / 2] tables on q's device. */
typedef struct {
    long k_code, v_code;
    fa_kv_scales scales;
    fa_rotary rotary;
} kv_extras;

static int parse_cache_codes(PyObject *quant, kv_extras *x)
{
    x->k_code = x->v_code = -1;
    if (quant == Py_None) return 0;
    if (!PyTuple_Check(quant) || PyTuple_GET_SIZE(quant) != 6)
        return raise_value("kv_quant: must be None or (k_dtype, v_dtype, k_scale, v_scale, k_descale, v_descale)"), -1;
    x->k_code = PyLong_AsLong(PyTuple_GET_ITEM(quant, 0));
    x->v_code = PyLong_AsLong(PyTuple_GET_ITEM(quant, 1));
    return PyErr_Occurred() ? -1 : 0;
}

static const char *dims_text(int ndim, const int64_t *shape, char *buf, size_t size)
{
    size_t used = (size_t)snprintf(buf, size, "[");
    for (int i = 0; i < ndim && used < size; ++i)
        used += (size_t)snprintf(buf + used, size - used, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (used < size) snprintf(buf + used, size - used, "]");
    return buf;
}

/* A packed float32 tensor of exactly this shape on q's device (writable when asked): a bare pointer
 * for the C API. */
static int bind_f32_exact(call *c, PyObject *obj, const char *name, int ndim, const int64_t *shape, int writable,
                          float **out)
{
    const DLTensor *t = bind_input(c, obj, name);
    if (!t) return -1;
    if (!shape_is(t, ndim, shape)) {
        char want[96], got[96];
        return raise_value("%s: expected shape %s, got %s", name, dims_text(ndim, shape, want, sizeof want),
                           shape_text(t, got, sizeof got)), -1;
    }
    if (check_f32_packed(t, name, ndim, shape) < 0) return -1;
    if (writable && c->inputs[c->n_inputs - 1].read_only) return raise_value("%s: is read-only", name), -1;
    *out = (float *)((char *)t->data + t->byte_offset);
    return 0;
}

/* The scales and the rotary tables, once the caches are bound; batch = the number of sequences. */
static int bind_kv_extras(call *c, PyObject *quant, PyObject *rotary, const fa_kv_cache *cache, int64_t batch,
                          int append, kv_extras *x)
{
    fa_kv_scales_init(&x->scales);
    fa_rotary_init(&x->rotary);
    if (quant != Py_None) {
        const fa_tensor *caches[2] = {&cache->k, &cache->v};
        static const char *scale_names[2] = {"k_scale", "v_scale"}, *descale_names[2] = {"k_descale", "v_descale"};
        float **scales[2] = {&x->scales.k_scale, &x->scales.v_scale};
        float *descales[2] = {NULL, NULL};
        int any = 0;
        for (int i = 0; i < 2; ++i) {
            PyObject *scale = PyTuple_GET_ITEM(quant, 2 + i), *descale = PyTuple_GET_ITEM(quant, 4 + i);
            if (scale != Py_None) {
                const int64_t shape[3] = {caches[i]->batch, caches[i]->seqlen, caches[i]->heads};
                if (bind_f32_exact(c, scale, scale_names[i], 3, shape, append, scales[i]) < 0) return -1;
                any = 1;
            }
            if (descale != Py_None) {
                const int64_t shape[2] = {batch, caches[i]->heads};
                if (bind_f32_exact(c, descale, descale_names[i], 2, shape, 0, &descales[i]) < 0) return -1;
                any = 1;
            }
        }
        x->scales.k_descale = descales[0];
        x->scales.v_descale = descales[1];
        if (any) c->opts.desc.kv_scales = &x->scales;
    }
    if (rotary != Py_None) {
        if (!PyTuple_Check(rotary) || PyTuple_GET_SIZE(rotary) != 3)
            return raise_value("rotary: must be None or (cos, sin, interleaved)"), -1;
        int interleaved = PyObject_IsTrue(PyTuple_GET_ITEM(rotary, 2));
        if (interleaved < 0) return -1;
        const DLTensor *cos = bind_input(c, PyTuple_GET_ITEM(rotary, 0), "rotary_cos");
        if (!cos) return -1;
        char got[96];
        if (cos->ndim != 2)
            return raise_value("rotary_cos: has shape %s, expected 2 dimensions [max_position, rotary_dim / 2]",
                               shape_text(cos, got, sizeof got)), -1;
        const int64_t shape[2] = {cos->shape[0], cos->shape[1]};
        if (check_f32_packed(cos, "rotary_cos", 2, shape) < 0) return -1;
        float *sin = NULL;
        if (bind_f32_exact(c, PyTuple_GET_ITEM(rotary, 1), "rotary_sin", 2, shape, 0, &sin) < 0) return -1;
        x->rotary.cos = (const float *)((const char *)cos->data + cos->byte_offset);
        x->rotary.sin = sin;
        x->rotary.max_position = shape[0];
        x->rotary.rotary_dim = 2 * shape[1];
        x->rotary.interleaved = interleaved;
        c->opts.desc.rotary = &x->rotary;
    }
    return 0;
}

/* forward_kvcache(q, k_cache, v_cache, k, v, out, lse, want_lse, cache_seqlens, block_table, cache_batch_idx,
 * cache_leftpad, kv_split_tokens, kv_quant, rotary, *options, backend, stream) -> (out | None, lse | None). k, v: None or
 * the tokens to append (in place, into the caches). cache_seqlens: an int32 [batch] tensor, a
 * sequence of ints or an int for every sequence. block_table: None (contiguous caches) or int32
 * [batch, max_pages_per_seq]. cache_batch_idx, cache_leftpad: None or int32 [batch] tables (a
 * tensor or a sequence of ints; cache_leftpad also an int for every sequence): fa_kv_slots.
 * kv_split_tokens: desc->kv_split_tokens (0 = the library's rule). Ragged queries come as the
 * options' varlen (cu_seqlens_q, cu_seqlens_k or None, max_seqlen_q, max_seqlen_k): q, out, k and
 * v are then packed [total, heads, head_dim], lse [heads_q, total_q], and batch is the number of
 * sequences, len(cu_seqlens_q) - 1; cu_seqlens_k packs k and v (None: packed like q). kv_quant, rotary:
 * the caches' dtypes and scales and the rotary tables (bind_kv_extras). */
static PyObject *py_forward_kvcache(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    enum { N_LEADING_ARGS = 15 };
    if (nargs != N_LEADING_ARGS + N_OPTION_ARGS + 2)
        return PyErr_Format(PyExc_TypeError, "forward_kvcache: takes %d arguments", N_LEADING_ARGS + N_OPTION_ARGS + 2);
    PyObject *const *option_args = args + N_LEADING_ARGS;
    call c;
    fa_tensor q, k_new, v_new, out;
    fa_kv_cache cache;
    memset(&cache, 0, sizeof cache);
    fa_kv_slots slots;
    fa_kv_slots_init(&slots);
    kv_extras extras;
    float *lse = NULL;
    int made_index[2] = {-1, -1};
    const int append = args[3] != Py_None || args[4] != Py_None;
    long long split = PyLong_AsLongLong(args[12]);
    if (split == -1 && PyErr_Occurred()) return NULL; /* a negative size is the C API's to report */
    if (parse_cache_codes(args[13], &extras) < 0) return NULL;
    if (begin_call_as(&c, args[0], &q, option_args, option_args[N_OPTION_ARGS], option_args[N_OPTION_ARGS + 1],
                      "cu_seqlens_k_new", 1) < 0)
        goto fail;
    c.opts.desc.kv_split_tokens = split;
    if (bind_cache_tensor(&c, args[1], "k_cache", append, extras.k_code, &cache.k) < 0 ||
        bind_cache_tensor(&c, args[2], "v_cache", append, extras.v_code, &cache.v) < 0)
        goto fail;
    if (append && (args[3] == Py_None || args[4] == Py_None)) {
        raise_value("%s: is None; give k and v together", args[3] == Py_None ? "k" : "v");
        goto fail;
    }
    /* New tokens: [batch, seqlen_new, heads_kv, head_dim], or packed [total_new, heads_kv, head_dim]. */
    if (append && (bind_tensor(&c, args[3], "k", &k_new) < 0 || bind_tensor(&c, args[4], "v", &v_new) < 0))
        goto fail;
    if (!append && c.packed && c.opts.varlen.cu_seqlens_k) {
        raise_value("cu_seqlens_k_new: packs k and v, which are None (leave it None)");
        goto fail;
    }
    /* The sequences: the packed batch's, else q's batch. */
    const int64_t batch = c.packed ? c.opts.varlen.batch : q.batch;
    int64_t seqlens_shape[1] = {batch};
    if (args[8] == Py_None) {
        raise_value("cache_seqlens: is None (give the number of tokens already in each sequence's cache)");
        goto fail;
    }
    if (bind_int32_table(&c, args[8], "cache_seqlens", 1, seqlens_shape, 1, &cache.cache_seqlens) < 0) goto fail;
    int64_t capacity = cache.k.seqlen;
    if (args[9] != Py_None) {
        int64_t table_shape[2] = {batch, -1};
        if (bind_int32_table(&c, args[9], "block_table", 2, table_shape, 0, &cache.block_table) < 0) goto fail;
        cache.max_pages_per_seq = table_shape[1];
        capacity = table_shape[1] * cache.k.seqlen;
    }
    const int with_slots = args[10] != Py_None || args[11] != Py_None;
    int64_t slot_shape[1] = {batch};
    if (args[10] != Py_None &&
        bind_int32_table(&c, args[10], "cache_batch_idx", 1, slot_shape, 0, &slots.cache_batch_idx) < 0)
        goto fail;
    slot_shape[0] = batch;
    if (args[11] != Py_None &&
        bind_int32_table(&c, args[11], "cache_leftpad", 1, slot_shape, 1, &slots.cache_leftpad) < 0)
        goto fail;
    if (bind_kv_extras(&c, args[13], args[14], &cache, batch, append, &extras) < 0) goto fail;
    set_extent(&c, &q, capacity);
    c.extent[3] = capacity; /* a bias is [batch, heads_q, seqlen_q or max_seqlen_q, capacity] */
    if (bind_modifiers(&c, option_args) < 0) goto fail;
    if (args[5] == Py_None) made_index[0] = c.n_made;
    if (bind_output(&c, args[5], "out", &q, &out) < 0) goto fail;
    int want_lse = PyObject_IsTrue(args[7]);
    if (want_lse < 0) goto fail;
    if (args[6] != Py_None || want_lse) {
        if (args[6] == Py_None) made_index[1] = c.n_made;
        if (bind_lse(&c, args[6], "lse", 1, &q, &lse) < 0) goto fail;
    }
    const fa_tensor *k_arg = append ? &k_new : NULL, *v_arg = append ? &v_new : NULL;
    fa_status st;
    RUN_API_CALL(&c, st, fa_forward_kvcache_ex(c.ctx, &c.opts.desc, &q, &cache, with_slots ? &slots : NULL, k_arg,
                                               v_arg, &out, lse));
    return finish_call(&c, st, made_index, 2);
fail:
    release_call(&c);
    return NULL;
}

/* kvcache_append(k_cache, v_cache, k, v, cache_seqlens, block_table, cache_batch_idx, cache_leftpad,
 * cu_seqlens_k_new, kv_quant, rotary, backend, stream) -> None: fa_kvcache_append. k, v: [batch,
 * seqlen_new, heads_kv, head_dim], or packed [total_new, heads_kv, head_dim] by cu_seqlens_k_new
 * (int32 [batch + 1]); the other arguments as forward_kvcache's. */
static PyObject *py_kvcache_append(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 13) return PyErr_Format(PyExc_TypeError, "kvcache_append: takes 13 arguments");
    call c;
    fa_tensor k_new, v_new;
    fa_kv_cache cache;
    memset(&cache, 0, sizeof cache);
    fa_kv_slots slots;
    fa_kv_slots_init(&slots);
    kv_extras extras;
    if (parse_cache_codes(args[9], &extras) < 0) return NULL;
    init_call(&c, args[12]);
    fa_attention_desc_init(&c.opts.desc);
    c.packed = args[8] != Py_None;
    if (bind_tensor(&c, args[2], "k", &k_new) < 0 || select_backend(&c, "k", args[11]) < 0) goto fail;
    if (bind_tensor(&c, args[3], "v", &v_new) < 0) goto fail;
    int64_t batch = k_new.batch;
    if (c.packed) {
        int64_t n = -1;
        if (bind_int32_table(&c, args[8], "cu_seqlens_k_new", 1, &n, 0, &c.opts.varlen.cu_seqlens_k) < 0) goto fail;
        if (n < 1) {
            raise_value("cu_seqlens_k_new: is empty; it holds batch + 1 offsets, the first 0");
            goto fail;
        }
        batch = c.opts.varlen.batch = n - 1;
        c.opts.varlen.max_seqlen_k = k_new.seqlen; /* no sequence appends more than all the rows */
        c.opts.desc.varlen = &c.opts.varlen;
    }
    if (bind_cache_tensor(&c, args[0], "k_cache", 1, extras.k_code, &cache.k) < 0 ||
        bind_cache_tensor(&c, args[1], "v_cache", 1, extras.v_code, &cache.v) < 0)
        goto fail;
    int64_t seqlens_shape[1] = {batch};
    if (args[4] == Py_None) {
        raise_value("cache_seqlens: is None (give the number of tokens already in each sequence's cache)");
        goto fail;
    }
    if (bind_int32_table(&c, args[4], "cache_seqlens", 1, seqlens_shape, 1, &cache.cache_seqlens) < 0) goto fail;
    if (args[5] != Py_None) {
        int64_t table_shape[2] = {batch, -1};
        if (bind_int32_table(&c, args[5], "block_table", 2, table_shape, 0, &cache.block_table) < 0) goto fail;
        cache.max_pages_per_seq = table_shape[1];
    }
    const int with_slots = args[6] != Py_None || args[7] != Py_None;
    int64_t slot_shape[1] = {batch};
    if (args[6] != Py_None &&
        bind_int32_table(&c, args[6], "cache_batch_idx", 1, slot_shape, 0, &slots.cache_batch_idx) < 0)
        goto fail;
    slot_shape[0] = batch;
    if (args[7] != Py_None && bind_int32_table(&c, args[7], "cache_leftpad", 1, slot_shape, 1, &slots.cache_leftpad) < 0)
        goto fail;
    if (bind_kv_extras(&c, args[9], args[10], &cache, batch, 1, &extras) < 0) goto fail;
    fa_status st;
    RUN_API_CALL(&c, st, fa_kvcache_append(c.ctx, &c.opts.desc, &cache, with_slots ? &slots : NULL, &k_new, &v_new));
    /* The tables copied here are freed by release_call: wait for the kernels first (finish_call's rule). */
    if (st == FA_SUCCESS && c.n_temps && c.backend != FA_BACKEND_CPU) st = fa_synchronize(c.ctx);
    if (st != FA_SUCCESS) {
        raise_last_error(st);
        goto fail;
    }
    release_call(&c);
    Py_RETURN_NONE;
fail:
    release_call(&c);
    return NULL;
}

/* merge_partials(outs, lses, out, lse_out, want_lse, backend, stream) -> (out | None, lse | None).
 * outs: a sequence of n tensors of one shape, [batch, seqlen, heads, head_dim], with lses
 * [batch, heads, seqlen]; or packed [total, heads, head_dim] with lses [heads, total]. */
static PyObject *py_merge_partials(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 7) return PyErr_Format(PyExc_TypeError, "merge_partials: takes 7 arguments");
    call c;
    init_call(&c, args[6]);
    fa_tensor *parts = NULL, out;
    const fa_tensor **part_ptrs = NULL;
    float **lse_ptrs = NULL, *lse_out = NULL;
    int made_index[2] = {-1, -1};
    PyObject *outs = PySequence_Fast(args[0], "outs: must be a sequence of tensors");
    PyObject *lses = outs ? PySequence_Fast(args[1], "lses: must be a sequence of tensors") : NULL;
    if (!lses) goto fail;
    const Py_ssize_t n = PySequence_Fast_GET_SIZE(outs);
    if (n < 1 || n > INT32_MAX / 4) {
        raise_value("outs: has %zd tensors; merging needs at least one", n);
        goto fail;
    }
    if (PySequence_Fast_GET_SIZE(lses) != n) {
        raise_value("lses: has %zd tensors, outs %zd; give one lse per partial output", PySequence_Fast_GET_SIZE(lses), n);
        goto fail;
    }
    c.max_inputs = (int)(2 * n + 2);
    c.inputs = calloc((size_t)c.max_inputs, sizeof *c.inputs);
    parts = calloc((size_t)n, sizeof *parts);
    part_ptrs = calloc((size_t)n, sizeof *part_ptrs);
    lse_ptrs = calloc((size_t)n, sizeof *lse_ptrs);
    if (!c.inputs || !parts || !part_ptrs || !lse_ptrs) {
        if (!c.inputs) c.inputs = c.fixed_inputs;
        PyErr_NoMemory();
        goto fail;
    }
    /* The first output's rank says the layout: 3 dimensions = a packed batch (lse [heads, total]). */
    const DLTensor *first = bind_input(&c, PySequence_Fast_GET_ITEM(outs, 0), "outs[0]");
    if (!first) goto fail;
    c.packed = first->ndim == 3;
    if (select_backend(&c, "outs[0]", args[5]) < 0) goto fail;
    char name[48];
    for (Py_ssize_t i = 0; i < n; ++i) {
        snprintf(name, sizeof name, "outs[%zd]", i);
        const DLTensor *t = i ? bind_input(&c, PySequence_Fast_GET_ITEM(outs, i), name) : first;
        if (!t || to_fa_tensor(t, name, c.packed, &parts[i]) < 0) goto fail;
        if (i && (parts[i].batch != parts[0].batch || parts[i].seqlen != parts[0].seqlen ||
                  parts[i].heads != parts[0].heads || parts[i].head_dim != parts[0].head_dim)) {
            raise_value("%s: shape differs from outs[0]'s", name);
            goto fail;
        }
        part_ptrs[i] = &parts[i];
        snprintf(name, sizeof name, "lses[%zd]", i);
        const DLTensor *l = bind_input(&c, PySequence_Fast_GET_ITEM(lses, i), name);
        if (!l) goto fail;
        if (check_lse(l, name, &parts[0], c.packed, &lse_ptrs[i]) < 0) goto fail;
    }
    if (args[2] == Py_None) made_index[0] = c.n_made;
    if (bind_output(&c, args[2], "out", &parts[0], &out) < 0) goto fail;
    int want_lse = PyObject_IsTrue(args[4]);
    if (want_lse < 0) goto fail;
    if (args[3] != Py_None || want_lse) {
        if (args[3] == Py_None) made_index[1] = c.n_made;
        if (bind_lse(&c, args[3], "lse_out", 1, &parts[0], &lse_out) < 0) goto fail;
    }
    fa_status st;
    RUN_API_CALL(&c, st,
                 fa_merge_partials(c.ctx, (int)n, part_ptrs, (const float *const *)lse_ptrs, &out, lse_out));
    PyObject *result = finish_call(&c, st, made_index, 2);
    free(parts);
    free(part_ptrs);
    free(lse_ptrs);
    Py_DECREF(outs);
    Py_DECREF(lses);
    return result;
fail:
    release_call(&c);
    free(parts);
    free(part_ptrs);
    free(lse_ptrs);
    Py_XDECREF(outs);
    Py_XDECREF(lses);
    return NULL;
}

/* dropout_mask(seed, offset, p, heads_q, seqlen_q, seqlen_k, batch_index, head_index) -> capsule uint8 [sq, sk] */
static PyObject *py_dropout_mask(PyObject *self, PyObject *args)
{
    unsigned long long seed, offset;
    double p;
    long long heads, sq, sk, b, h;
    if (!PyArg_ParseTuple(args, "KKdLLLLL", &seed, &offset, &p, &heads, &sq, &sk, &b, &h)) return NULL;
    /* Non-positive sizes are the C API's to report; the buffer then only needs to exist. */
    int64_t shape[2] = {sq > 0 ? sq : 0, sk > 0 ? sk : 0};
    if (shape[1] && shape[0] > (int64_t)(PY_SSIZE_T_MAX / shape[1]))
        return raise_value("seqlen_q x seqlen_k: %lld x %lld bytes do not fit in memory", sq, sk);
    DLDevice host = {kDLCPU, 0};
    DLDataType u8 = {kDLUInt, 8, 1};
    exported *e = new_output(NULL, host, u8, 2, shape);
    if (!e) return NULL;
    fa_status st;
    Py_BEGIN_ALLOW_THREADS
    st = fa_dropout_mask(seed, offset, (float)p, heads, sq, sk, b, h, e->mt.dl_tensor.data);
    Py_END_ALLOW_THREADS
    if (st != FA_SUCCESS) {
        discard_output(e);
        return raise_last_error(st);
    }
    return export_output(e);
}

static PyObject *py_tiling_for(PyObject *self, PyObject *args)
{
    long long sram, d;
    if (!PyArg_ParseTuple(args, "LL", &sram, &d)) return NULL;
    fa_tiling t = fa_tiling_for(sram, d);
    return Py_BuildValue("(LL)", (long long)t.block_rows, (long long)t.block_cols);
}

/* The number of fa_backend values: the library numbers them from FA_BACKEND_AUTO = 0 upwards and
 * names any other "unknown", so its list is the one the package uses. */
static int backend_count(void)
{
    int n = 0;
    while (strcmp(fa_backend_name((fa_backend)n), "unknown") != 0) ++n;
    return n;
}

/* (name of backend 0, name of backend 1, ...): the index is the fa_backend value. */
static PyObject *py_backend_names(PyObject *self, PyObject *unused)
{
    const int n = backend_count();
    PyObject *names = PyTuple_New(n);
    for (int i = 0; names && i < n; ++i) {
        PyObject *name = PyUnicode_FromString(fa_backend_name((fa_backend)i));
        if (!name) Py_CLEAR(names);
        else PyTuple_SET_ITEM(names, i, name);
    }
    return names;
}

/* [(name, available, detail)] for every backend but auto: detail is fa_context_info() or the
 * reason it is unavailable. */
static PyObject *py_backends(PyObject *self, PyObject *unused)
{
    const int n = backend_count() - FA_BACKEND_CPU;
    PyObject *list = PyList_New(n > 0 ? n : 0);
    for (int i = 0; list && i < n; ++i) {
        const fa_backend backend = (fa_backend)(FA_BACKEND_CPU + i);
        fa_context *ctx = NULL;
        fa_status st = fa_context_create(backend, 0, &ctx);
        const char *name = fa_backend_name(backend);
        PyObject *item = st == FA_SUCCESS ? Py_BuildValue("(sOs)", name, Py_True, fa_context_info(ctx))
                                          : Py_BuildValue("(sOs)", name, Py_False, fa_last_error());
        fa_context_destroy(ctx);
        if (!item) Py_CLEAR(list);
        else PyList_SET_ITEM(list, i, item);
    }
    return list;
}

static PyObject *py_version(PyObject *self, PyObject *unused) { return PyUnicode_FromString(fa_version_string()); }

static PyMethodDef methods[] = {
    {"forward", (PyCFunction)(void (*)(void))py_forward, METH_FASTCALL,
     "forward(q, k, v, out, lse, want_lse, scale, causal, window_left, window_right, seqlens_k, dropout_p, seed, "
     "offset, block_mask, block_q, block_k, softcap, alibi_slopes, sinks, bias, backend, stream) "
     "-> (out capsule | None, lse capsule | None)"},
    {"backward", (PyCFunction)(void (*)(void))py_backward, METH_FASTCALL,
     "backward(q, k, v, out, dout, lse, dq, dk, dv, dsinks, dbias, <options as forward>, backend, stream) "
     "-> (dq, dk, dv, dsinks, dbias) capsules or None"},
    {"forward_kvcache", (PyCFunction)(void (*)(void))py_forward_kvcache, METH_FASTCALL,
     "forward_kvcache(q, k_cache, v_cache, k, v, out, lse, want_lse, cache_seqlens, block_table, cache_batch_idx, "
     "cache_leftpad, kv_split_tokens, kv_quant, rotary, <options as forward>, backend, stream) "
     "-> (out capsule | None, lse capsule | None)"},
    {"kvcache_append", (PyCFunction)(void (*)(void))py_kvcache_append, METH_FASTCALL,
     "kvcache_append(k_cache, v_cache, k, v, cache_seqlens, block_table, cache_batch_idx, cache_leftpad, "
     "cu_seqlens_k_new, kv_quant, rotary, backend, stream) -> None"},
    {"merge_partials", (PyCFunction)(void (*)(void))py_merge_partials, METH_FASTCALL,
     "merge_partials(outs, lses, out, lse_out, want_lse, backend, stream) -> (out capsule | None, lse capsule | None)"},
    {"export", py_export, METH_VARARGS, "export(output, versioned): the output as a DLPack capsule, once"},
    {"dropout_mask", py_dropout_mask, METH_VARARGS, "fa_dropout_mask: a uint8 [seqlen_q, seqlen_k] capsule"},
    {"tiling_for", py_tiling_for, METH_VARARGS, "fa_tiling_for: (block_rows, block_cols)"},
    {"backend_names", py_backend_names, METH_NOARGS, "fa_backend_name(n) for n = 0, 1, ... (index = fa_backend)"},
    {"backends", py_backends, METH_NOARGS, "[(name, available, detail)] for each backend but auto"},
    {"version", py_version, METH_NOARGS, "fa_version_string() of the loaded library"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, .m_name = "flashattn._native", .m_doc = "Binding of the flashattn C API", .m_size = -1,
    .m_methods = methods};

PyMODINIT_FUNC PyInit__native(void)
{
    PyObject *errors = PyImport_ImportModule("flashattn._errors");
    if (!errors) return NULL;
    static const char *class_names[6] = {"Error", "InvalidValueError", "NotSupportedError", "OutOfMemoryError",
                                         "BackendUnavailableError", "BackendFailureError"};
    for (int i = 0; i < 6; ++i)
        if (!(error_classes[i] = PyObject_GetAttrString(errors, class_names[i]))) goto fail;
    if (!(type_error_class = PyObject_GetAttrString(errors, "InvalidTypeError"))) goto fail;
    Py_DECREF(errors);
    if (!(max_version_kwargs = Py_BuildValue("{s(ii)}", "max_version", 1, 0))) return NULL;
    return PyModule_Create(&module);
fail:
    Py_DECREF(errors);
    return NULL;
}
