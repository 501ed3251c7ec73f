/*
 * Compiled frame encoding (docs/FORMATS.md, "Frames"; docs/ARCHITECTURE.md,
 * "Compiled code"): the per-record loops of a write and of a checkpoint.
 *
 * The Python loops in topics.format.frame (python_encode_batch) and
 * topics.storage.segment (python_segment_blob) are the reference and the
 * fallback where this module is not built; tests/unit/test_codec_native.py
 * holds both to the same bytes.
 *
 * encode_batch(topic_id, first_seq, ts, records, durable) -> (frames, sizes)
 *
 *   records  a list of tuples (data, meta, node, tag, ...): data bytes, meta
 *            bytes or None, node and tag str or None (other items ignored)
 *   frames   one bytes object: the WAL Append frames of seqs first_seq, ...
 *            back to back, every frame but the last flagged "more follow"
 *   sizes    list[int], each frame's size in bytes
 *
 *   Raises OverflowError when a number does not fit its field (u64 topic_id,
 *   seq, ts; u16 node/tag bytes; u32 frame_len), UnicodeEncodeError for a
 *   node or tag with a lone surrogate, TypeError for a record of another shape.
 *
 * segment_frames(bufs, which, offs, lens) -> bytes
 *
 *   bufs     a list of buffers holding trusted WAL Append frames
 *   which, offs, lens
 *            contiguous int64 buffers: frame i is
 *            bufs[which[i]][offs[i] : offs[i] + lens[i]]
 *   Returns the segment frames back to back: each WAL frame without its type
 *   byte, frame_len one less, with the XXH3-64 of its new body. Raises
 *   ValueError for a frame outside its buffer or shorter than a header.
 *   Large conversions run without the GIL.
 *
 * prepare_records(records, batch_node, record_type, dumps, max_record_bytes,
 *                 max_meta_bytes, max_meta_keys, max_tag_bytes, max_node_bytes)
 *     -> list | None
 *
 *   The common case of topics.engine.records._prepare_each: every record is a
 *   dict whose `data` (and `meta`) `dumps` serialises, within every cap, with
 *   a string or null `tag` and `node`. Returns the list of
 *   record_type(data, meta, node, tag, nbytes, 0) values, or None as soon as a
 *   record is anything else: the Python loop then runs from the start and
 *   gives the error (docs/API.md, "7.1"). It never raises for a record.
 */
#include "_common.h"

#define XXH_INLINE_ALL
#include "_vendor/xxhash/xxhash.h"

#define FIXED (WAL_HDR - 4) /* header bytes counted by frame_len */
#define NOGIL_BYTES (64 * 1024)


/* One record's fields, borrowed from its tuple (the list keeps them alive). */
typedef struct {
    const char *data, *meta, *node, *tag;
    Py_ssize_t dl, ml, nl, tl;
    int has_meta, has_node, has_tag;
} Rec;

static int bytes_of(PyObject *o, const char **p, Py_ssize_t *n, const char *what) {
    if (!PyBytes_Check(o)) {
        PyErr_Format(PyExc_TypeError, "record %s must be bytes, not %.50s", what,
                     Py_TYPE(o)->tp_name);
        return -1;
    }
    *p = PyBytes_AS_STRING(o);
    *n = PyBytes_GET_SIZE(o);
    return 0;
}

static int text_of(PyObject *o, const char **p, Py_ssize_t *n, int *has, const char *what) {
    if (o == Py_None) {
        *p = "";
        *n = 0;
        *has = 0;
        return 0;
    }
    if (!PyUnicode_Check(o)) {
        PyErr_Format(PyExc_TypeError, "record %s must be str or None", what);
        return -1;
    }
    *p = PyUnicode_AsUTF8AndSize(o, n); /* UnicodeEncodeError on a lone surrogate */
    if (*p == NULL) return -1;
    if (*n > 0xFFFF) {
        PyErr_Format(PyExc_OverflowError, "%s is %zd bytes, more than a u16 holds", what, *n);
        return -1;
    }
    *has = 1;
    return 0;
}

static int rec_of(PyObject *t, Rec *r) {
    if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) < 4) {
        PyErr_SetString(PyExc_TypeError, "a record is a tuple (data, meta, node, tag, ...)");
        return -1;
    }
    if (bytes_of(PyTuple_GET_ITEM(t, 0), &r->data, &r->dl, "data") < 0) return -1;
    PyObject *m = PyTuple_GET_ITEM(t, 1);
    r->has_meta = m != Py_None;
    r->meta = "";
    r->ml = 0;
    if (r->has_meta && bytes_of(m, &r->meta, &r->ml, "meta") < 0) return -1;
    if (text_of(PyTuple_GET_ITEM(t, 2), &r->node, &r->nl, &r->has_node, "node") < 0) return -1;
    if (text_of(PyTuple_GET_ITEM(t, 3), &r->tag, &r->tl, &r->has_tag, "tag") < 0) return -1;
    return 0;
}

/* The payload length of a record: data, or meta_len u32 | meta | data. */
static inline Py_ssize_t payload_len(const Rec *r) {
    return r->has_meta ? 4 + r->ml + r->dl : r->dl;
}

static PyObject *encode_batch(PyObject *self, PyObject *args) {
    PyObject *recs;
    PyObject *tid_o, *seq_o, *ts_o;
    int durable;
    if (!PyArg_ParseTuple(args, "OOOO!p", &tid_o, &seq_o, &ts_o, &PyList_Type, &recs, &durable))
        return NULL;
    uint64_t topic_id = PyLong_AsUnsignedLongLong(tid_o);
    if (topic_id == (uint64_t)-1 && PyErr_Occurred()) return NULL;
    uint64_t first = PyLong_AsUnsignedLongLong(seq_o);
    if (first == (uint64_t)-1 && PyErr_Occurred()) return NULL;
    uint64_t ts = PyLong_AsUnsignedLongLong(ts_o);
    if (ts == (uint64_t)-1 && PyErr_Occurred()) return NULL;
    Py_ssize_t n = PyList_GET_SIZE(recs);
    if (n > 0 && first + (uint64_t)(n - 1) < first) {
        PyErr_SetString(PyExc_OverflowError, "seq does not fit a u64");
        return NULL;
    }
    Rec *rs = PyMem_Malloc(sizeof(Rec) * (size_t)(n ? n : 1));
    if (rs == NULL) return PyErr_NoMemory();
    PyObject *sizes = NULL, *blob = NULL, *res = NULL;
    Py_ssize_t total = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (rec_of(PyList_GET_ITEM(recs, i), &rs[i]) < 0) goto done;
        Py_ssize_t flen = FIXED + rs[i].nl + rs[i].tl + payload_len(&rs[i]) + CRC;
        if (flen > (Py_ssize_t)UINT32_MAX) {
            PyErr_SetString(PyExc_OverflowError, "frame_len does not fit a u32");
            goto done;
        }
        total += flen + 4;
    }
    sizes = PyList_New(n);
    if (sizes == NULL) goto done;
    blob = PyBytes_FromStringAndSize(NULL, total);
    if (blob == NULL) goto done;
    char *w = PyBytes_AS_STRING(blob);
    const uint8_t base = durable ? F_DURABLE : 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        const Rec *r = &rs[i];
        Py_ssize_t pl = payload_len(r);
        uint32_t flen = (uint32_t)(FIXED + r->nl + r->tl + pl + CRC);
        uint8_t flags = base;
        if (i != n - 1) flags |= F_BATCH_MORE;
        if (r->has_node) flags |= F_HAS_NODE;
        if (r->has_tag) flags |= F_HAS_TAG;
        if (r->has_meta) flags |= F_HAS_META;
        char *f = w;
        wr32(w, flen);
        w[4] = APPEND;
        w[5] = (char)flags;
        wr64(w + 6, topic_id);
        wr64(w + 14, first + (uint64_t)i);
        wr64(w + 22, ts);
        wr16(w + 30, (uint16_t)r->nl);
        wr16(w + 32, (uint16_t)r->tl);
        wr32(w + 34, (uint32_t)pl);
        w += WAL_HDR;
        memcpy(w, r->node, (size_t)r->nl);
        w += r->nl;
        memcpy(w, r->tag, (size_t)r->tl);
        w += r->tl;
        if (r->has_meta) {
            wr32(w, (uint32_t)r->ml);
            memcpy(w + 4, r->meta, (size_t)r->ml);
            w += 4 + r->ml;
        }
        memcpy(w, r->data, (size_t)r->dl);
        w += r->dl;
        wr64(w, (uint64_t)XXH3_64bits(f + 4, (size_t)(w - f - 4)));
        w += CRC;
        PyObject *sz = PyLong_FromSsize_t((Py_ssize_t)flen + 4);
        if (sz == NULL) goto done;
        PyList_SET_ITEM(sizes, i, sz);
    }
    res = PyTuple_Pack(2, blob, sizes);
done:
    Py_XDECREF(blob);
    Py_XDECREF(sizes);
    PyMem_Free(rs);
    return res;
}

static PyObject *segment_frames(PyObject *self, PyObject *args) {
    PyObject *bufs, *wo, *oo, *lo;
    if (!PyArg_ParseTuple(args, "O!OOO", &PyList_Type, &bufs, &wo, &oo, &lo)) return NULL;
    Py_ssize_t nb = PyList_GET_SIZE(bufs);
    Py_buffer *views = PyMem_Calloc((size_t)(nb ? nb : 1), sizeof(Py_buffer));
    if (views == NULL) return PyErr_NoMemory();
    Py_ssize_t got = 0;
    Py_buffer vw, vo, vl;
    int have_w = 0, have_o = 0, have_l = 0;
    PyObject *blob = NULL;
    for (; got < nb; got++) {
        if (PyObject_GetBuffer(PyList_GET_ITEM(bufs, got), &views[got], PyBUF_SIMPLE) < 0)
            goto done;
    }
    if (get_i64(wo, &vw, "which") < 0) goto done;
    have_w = 1;
    if (get_i64(oo, &vo, "offs") < 0) goto done;
    have_o = 1;
    if (get_i64(lo, &vl, "lens") < 0) goto done;
    have_l = 1;
    Py_ssize_t n = vw.len / 8;
    if (vo.len / 8 != n || vl.len / 8 != n) {
        PyErr_SetString(PyExc_ValueError, "which, offs and lens differ in length");
        goto done;
    }
    const int64_t *which = vw.buf, *offs = vo.buf, *lens = vl.buf;
    Py_ssize_t total = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t k = which[i], o = offs[i], ln = lens[i];
        if (k < 0 || k >= nb || o < 0 || ln < WAL_HDR + CRC || o + ln > views[k].len) {
            PyErr_Format(PyExc_ValueError, "frame %zd is outside its buffer", i);
            goto done;
        }
        total += ln - 1;
    }
    blob = PyBytes_FromStringAndSize(NULL, total);
    if (blob == NULL) goto done;
    char *w = PyBytes_AS_STRING(blob);
    PyThreadState *ts = total >= NOGIL_BYTES ? PyEval_SaveThread() : NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        const unsigned char *f = (const unsigned char *)views[which[i]].buf + offs[i];
        /* [flags .. payload] follows frame_len and the type byte; the checksum ends it */
        size_t body = (size_t)lens[i] - 5 - CRC;
        wr32(w, (uint32_t)(body + CRC));
        memcpy(w + 4, f + 5, body);
        wr64(w + 4 + body, (uint64_t)XXH3_64bits(w + 4, body));
        w += 4 + body + CRC;
    }
    if (ts != NULL) PyEval_RestoreThread(ts);
done:
    if (have_l) PyBuffer_Release(&vl);
    if (have_o) PyBuffer_Release(&vo);
    if (have_w) PyBuffer_Release(&vw);
    for (Py_ssize_t i = 0; i < got; i++) PyBuffer_Release(&views[i]);
    PyMem_Free(views);
    if (PyErr_Occurred()) {
        Py_XDECREF(blob);
        return NULL;
    }
    return blob;
}


/* -- records on their way in ------------------------------------------------------- */

static PyObject *k_data, *k_meta, *k_tag, *k_node;

#define EXACT_COPY_BYTES 512 /* see _EXACT_COPY_BYTES in topics/engine/records.py */

/* dumps(value) as exact-size bytes, or NULL with no error set when it cannot be. */
static PyObject *dump(PyObject *dumps, PyObject *value) {
    PyObject *b = PyObject_CallOneArg(dumps, value);
    if (b == NULL || !PyBytes_CheckExact(b)) {
        PyErr_Clear();
        Py_XDECREF(b);
        return NULL;
    }
    Py_ssize_t n = PyBytes_GET_SIZE(b);
    if (n > EXACT_COPY_BYTES) {
        PyObject *c = PyBytes_FromStringAndSize(PyBytes_AS_STRING(b), n);
        Py_DECREF(b);
        if (c == NULL) PyErr_Clear();
        return c;
    }
    return b;
}

/* A record's optional string field: 1 with *out (new ref, None for null or ""),
   0 when it is anything the Python loop must judge. */
static int opt_str(PyObject *rec, PyObject *key, Py_ssize_t max_bytes, PyObject **out) {
    PyObject *v = PyDict_GetItemWithError(rec, key);
    if (v == NULL && PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    if (v == NULL || v == Py_None) {
        *out = Py_NewRef(Py_None);
        return 1;
    }
    if (!PyUnicode_Check(v)) return 0;
    Py_ssize_t n;
    if (PyUnicode_AsUTF8AndSize(v, &n) == NULL) {
        PyErr_Clear();
        return 0;
    }
    if (n > max_bytes) return 0;
    *out = Py_NewRef(n ? v : Py_None);
    return 1;
}

static PyObject *one_record(PyObject *rec, PyObject *batch_node, PyTypeObject *rtype,
                            PyObject *dumps, const Py_ssize_t *caps) {
    /* caps: max_record_bytes, max_meta_bytes, max_meta_keys, max_tag_bytes, max_node_bytes */
    if (!PyDict_CheckExact(rec)) return NULL;
    PyObject *dv = PyDict_GetItemWithError(rec, k_data);
    if (dv == NULL) {
        PyErr_Clear();
        return NULL;
    }
    PyObject *data = dump(dumps, dv);
    if (data == NULL) return NULL;
    PyObject *meta = NULL, *tag = NULL, *node = NULL, *nb = NULL, *r = NULL;
    Py_ssize_t size = PyBytes_GET_SIZE(data);
    PyObject *mv = PyDict_GetItemWithError(rec, k_meta);
    if (mv == NULL && PyErr_Occurred()) goto fail;
    if (mv != NULL && mv != Py_None) {
        meta = dump(dumps, mv);
        if (meta == NULL || PyBytes_GET_SIZE(meta) > caps[1]) goto fail;
        if (PyDict_CheckExact(mv) && PyDict_GET_SIZE(mv) > caps[2]) goto fail;
        size += PyBytes_GET_SIZE(meta);
    } else {
        meta = Py_NewRef(Py_None);
    }
    if (size > caps[0]) goto fail;
    if (PyDict_GET_SIZE(rec) == 1) { /* only "data": the common case */
        tag = Py_NewRef(Py_None);
        node = Py_NewRef(batch_node);
    } else {
        if (!opt_str(rec, k_tag, caps[3], &tag)) goto fail;
        PyObject *nv = PyDict_GetItemWithError(rec, k_node);
        if (nv == NULL && PyErr_Occurred()) goto fail;
        if (nv == NULL || nv == Py_None) {
            node = Py_NewRef(batch_node);
        } else if (!opt_str(rec, k_node, caps[4], &node)) {
            goto fail;
        }
    }
    nb = PyLong_FromSsize_t(size);
    if (nb == NULL) goto fail;
    r = rtype->tp_alloc(rtype, 6);
    if (r == NULL) goto fail;
    PyTuple_SET_ITEM(r, 0, data);
    PyTuple_SET_ITEM(r, 1, meta);
    PyTuple_SET_ITEM(r, 2, node);
    PyTuple_SET_ITEM(r, 3, tag);
    PyTuple_SET_ITEM(r, 4, nb);
    PyTuple_SET_ITEM(r, 5, PyLong_FromLong(0)); /* a small int: never fails */
    return r;
fail:
    PyErr_Clear();
    Py_DECREF(data);
    Py_XDECREF(meta);
    Py_XDECREF(tag);
    Py_XDECREF(node);
    Py_XDECREF(nb);
    return NULL;
}

static PyObject *prepare_records(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 9 || !PyList_CheckExact(args[0]) || !PyType_Check(args[2]) ||
        !PyType_IsSubtype((PyTypeObject *)args[2], &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError,
                        "prepare_records(records: list, batch_node, record_type: tuple type, "
                        "dumps, max_record_bytes, max_meta_bytes, max_meta_keys, "
                        "max_tag_bytes, max_node_bytes)");
        return NULL;
    }
    Py_ssize_t caps[5];
    for (int i = 0; i < 5; i++) {
        caps[i] = PyLong_AsSsize_t(args[4 + i]);
        if (caps[i] == -1 && PyErr_Occurred()) return NULL;
    }
    PyObject *recs = args[0];
    Py_ssize_t n = PyList_GET_SIZE(recs);
    PyObject *out = PyList_New(n);
    if (out == NULL) return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *r = one_record(PyList_GET_ITEM(recs, i), args[1], (PyTypeObject *)args[2],
                                 args[3], caps);
        if (r == NULL) {
            Py_DECREF(out);
            Py_RETURN_NONE;
        }
        PyList_SET_ITEM(out, i, r);
    }
    return out;
}

static PyMethodDef methods[] = {
    {"encode_batch", encode_batch, METH_VARARGS,
     "encode_batch(topic_id, first_seq, ts, records, durable) -> (frames, sizes)\n\n"
     "The WAL Append frames of a write, back to back, and each frame's size."},
    {"segment_frames", segment_frames, METH_VARARGS,
     "segment_frames(bufs, which, offs, lens) -> bytes\n\n"
     "Segment frames for trusted WAL Append frames, back to back."},
    {"prepare_records", (PyCFunction)(void (*)(void))prepare_records, METH_FASTCALL,
     "prepare_records(records, batch_node, record_type, dumps, max_record_bytes, "
     "max_meta_bytes, max_meta_keys, max_tag_bytes, max_node_bytes) -> list | None\n\n"
     "The validated records of a write, or None for the Python loop to judge."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_codec", "Compiled frame encoding (docs/FORMATS.md).", -1, methods,
};

PyMODINIT_FUNC PyInit__codec(void) {
    const uint16_t probe = 1;
    if (*(const unsigned char *)&probe != 1) {
        PyErr_SetString(PyExc_ImportError, "_codec needs a little-endian host");
        return NULL;
    }
    k_data = PyUnicode_InternFromString("data");
    k_meta = PyUnicode_InternFromString("meta");
    k_tag = PyUnicode_InternFromString("tag");
    k_node = PyUnicode_InternFromString("node");
    if (!k_data || !k_meta || !k_tag || !k_node) return NULL;
    return PyModule_Create(&module);
}
