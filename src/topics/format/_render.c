/*
 * Compiled record rendering: the wire object of each record (docs/API.md,
 * "4. Records") spliced from its stored frame (docs/FORMATS.md, "Frames").
 *
 * This is the per-record loop of topics.engine.frames.render_frames, which
 * remains the reference implementation and the fallback when this module is
 * not built; tests/unit/test_render_native.py holds both to the same bytes.
 *
 * render(out, buf, base, seqs, offs, lens, tss, hdr, verify,
 *        include_tags, include_meta, include_data) -> None | (index, reason)
 *
 *   out    list: one bytes object is appended per record
 *   buf    any contiguous buffer (bytes, bytearray, memoryview, mmap) holding
 *          the frames; a frame at source offset `off` starts at buf[off - base]
 *   seqs, offs, lens, tss
 *          contiguous int64 buffers of equal length, one entry per record
 *          (its seq, frame offset and length in bytes, commit time in ms)
 *   hdr    header size of the frames' kind: 38 (WAL) or 37 (segment)
 *   verify check the length prefix, the seq and the XXH3-64 of every frame
 *
 * Returns None when every record rendered, else (i, reason) for the first
 * record i that could not be (records before it were appended). Bounds are
 * always checked, whether or not `verify` is set.
 *
 * A large run is checked and copied without the GIL (the buffers stay exported,
 * so none of them can be resized or closed meanwhile); only the allocation of
 * the bytes objects and the appends hold it.
 */
#include "_common.h"

#define XXH_INLINE_ALL
#include "_vendor/xxhash/xxhash.h"

#define FLAGS_BACK 33
#define SEQ_BACK 24
#define LENS_BACK 8

/* Decimal digits of v into out (no terminator); returns the count. */
static Py_ssize_t put_i64(char *out, int64_t v) {
    char tmp[24];
    Py_ssize_t n = 0, k = 0;
    uint64_t u;
    if (v < 0) {
        out[k++] = '-';
        u = (uint64_t)0 - (uint64_t)v;
    } else {
        u = (uint64_t)v;
    }
    do {
        tmp[n++] = (char)('0' + (u % 10));
        u /= 10;
    } while (u);
    while (n) out[k++] = tmp[--n];
    return k;
}

/* Bytes of s as a JSON string, escaped as orjson escapes it (quotes included). */
static Py_ssize_t json_str_len(const unsigned char *s, Py_ssize_t n) {
    Py_ssize_t len = 2;
    for (Py_ssize_t i = 0; i < n; i++) {
        unsigned char c = s[i];
        if (c == '"' || c == '\\' || c == '\b' || c == '\t' || c == '\n' || c == '\f' ||
            c == '\r')
            len += 2;
        else if (c < 0x20)
            len += 6;
        else
            len += 1;
    }
    return len;
}

static char *put_json_str(char *w, const unsigned char *s, Py_ssize_t n) {
    static const char hex[] = "0123456789abcdef";
    *w++ = '"';
    for (Py_ssize_t i = 0; i < n; i++) {
        unsigned char c = s[i];
        switch (c) {
        case '"': *w++ = '\\'; *w++ = '"'; break;
        case '\\': *w++ = '\\'; *w++ = '\\'; break;
        case '\b': *w++ = '\\'; *w++ = 'b'; break;
        case '\t': *w++ = '\\'; *w++ = 't'; break;
        case '\n': *w++ = '\\'; *w++ = 'n'; break;
        case '\f': *w++ = '\\'; *w++ = 'f'; break;
        case '\r': *w++ = '\\'; *w++ = 'r'; break;
        default:
            if (c < 0x20) {
                memcpy(w, "\\u00", 4);
                w += 4;
                *w++ = hex[c >> 4];
                *w++ = hex[c & 15];
            } else {
                *w++ = (char)c;
            }
        }
    }
    *w++ = '"';
    return w;
}

/* One record's parts, found by the planning pass. */
typedef struct {
    const unsigned char *node, *tag, *data, *meta;
    Py_ssize_t nl, tl, dl, ml, size;
} Part;

typedef struct {
    const unsigned char *b;
    Py_ssize_t blen;
    int64_t base;
    const int64_t *seqs, *offs, *lens, *tss;
    Py_ssize_t n;
    int hdr, verify, include_tags, include_meta, include_data;
} Run;

/* Check and measure every record (no Python objects touched: runs without the GIL).
 * Returns the index of the first bad record with *why set, or -1. */
static Py_ssize_t plan(const Run *r, Part *parts, const char **why) {
    const int plain_ok = r->include_data && !r->include_tags;
    char num[24];
    for (Py_ssize_t i = 0; i < r->n; i++) {
        Part *pt = &parts[i];
        int64_t o64 = r->offs[i] - r->base, ln64 = r->lens[i];
        if (ln64 < r->hdr + CRC || o64 < 0 || o64 > r->blen || ln64 > r->blen - o64) {
            *why = "frame outside the file";
            return i;
        }
        const unsigned char *f = r->b + o64;
        const int hdr = r->hdr;
        Py_ssize_t end = (Py_ssize_t)ln64 - CRC; /* relative to f */
        if (r->verify) {
            if ((int64_t)rd32(f) != ln64 - 4) {
                *why = "frame_len does not match the indexed length";
                return i;
            }
            if (rd64(f + hdr - SEQ_BACK) != (uint64_t)r->seqs[i]) {
                *why = "frame carries another seq";
                return i;
            }
            if (XXH3_64bits(f + 4, (size_t)(end - 4)) != rd64(f + end)) {
                *why = "checksum mismatch";
                return i;
            }
        }
        unsigned flags = f[hdr - FLAGS_BACK];
        pt->node = pt->tag = pt->meta = NULL;
        pt->nl = pt->tl = pt->ml = 0;
        if (plain_ok && !(flags & F_RECORD_MASK)) {
            pt->data = f + hdr;
            pt->dl = end - hdr;
        } else {
            Py_ssize_t p = hdr;
            Py_ssize_t nlen = rd16(f + hdr - LENS_BACK), tlen = rd16(f + hdr - LENS_BACK + 2);
            if (nlen + tlen > end - p) {
                *why = "lengths inconsistent with frame_len";
                return i;
            }
            if (flags & F_HAS_NODE) { pt->node = f + p; pt->nl = nlen; }
            p += nlen;
            if (flags & F_HAS_TAG) { pt->tag = f + p; pt->tl = tlen; }
            p += tlen;
            if (flags & F_HAS_META) {
                Py_ssize_t m = end - p < 4 ? -1 : (Py_ssize_t)rd32(f + p);
                if (m < 0 || m > end - p - 4) {
                    *why = "meta_len inconsistent with data_len";
                    return i;
                }
                pt->meta = f + p + 4;
                pt->ml = m;
                pt->data = pt->meta + m;
                pt->dl = end - (p + 4 + m);
            } else {
                pt->data = f + p;
                pt->dl = end - p;
            }
        }
        /* {"$seq":N,"$ts":T} plus the optional members */
        Py_ssize_t size = 8 + put_i64(num, r->seqs[i]) + 7 + put_i64(num, r->tss[i]) + 1;
        if (pt->node) size += 9 + json_str_len(pt->node, pt->nl);
        if (r->include_tags && pt->tag) size += 8 + json_str_len(pt->tag, pt->tl);
        if (r->include_data) size += 8 + pt->dl;
        if (r->include_meta && pt->meta) size += 8 + pt->ml;
        pt->size = size;
    }
    return -1;
}

/* Write record i into dst (exactly parts[i].size bytes; runs without the GIL). */
static void fill(const Run *r, const Part *pt, Py_ssize_t i, char *w) {
    memcpy(w, "{\"$seq\":", 8); w += 8;
    w += put_i64(w, r->seqs[i]);
    memcpy(w, ",\"$ts\":", 7); w += 7;
    w += put_i64(w, r->tss[i]);
    if (pt->node) {
        memcpy(w, ",\"$node\":", 9); w += 9;
        w = put_json_str(w, pt->node, pt->nl);
    }
    if (r->include_tags && pt->tag) {
        memcpy(w, ",\"$tag\":", 8); w += 8;
        w = put_json_str(w, pt->tag, pt->tl);
    }
    if (r->include_data) {
        memcpy(w, ",\"data\":", 8); w += 8;
        memcpy(w, pt->data, (size_t)pt->dl); w += pt->dl;
    }
    if (r->include_meta && pt->meta) {
        memcpy(w, ",\"meta\":", 8); w += 8;
        memcpy(w, pt->meta, (size_t)pt->ml); w += pt->ml;
    }
    *w = '}';
}

/* Runs this large (bytes of frames) check and copy without holding the GIL, so
 * the other threads of the process (the WAL writers) are not held up meanwhile. */
#define NOGIL_BYTES (64 * 1024)

static PyObject *render_run(PyObject *out, const Run *r) {
    Part *parts = PyMem_Malloc(sizeof(Part) * (size_t)(r->n ? r->n : 1));
    PyObject **objs = PyMem_Malloc(sizeof(PyObject *) * (size_t)(r->n ? r->n : 1));
    PyObject *res = NULL;
    if (parts == NULL || objs == NULL) {
        PyErr_NoMemory();
        goto out;
    }
    int64_t total = 0;
    for (Py_ssize_t i = 0; i < r->n; i++) total += r->lens[i] > 0 ? r->lens[i] : 0;
    const int nogil = total >= NOGIL_BYTES;
    const char *why = NULL;
    Py_ssize_t badi;
    if (nogil) {
        Py_BEGIN_ALLOW_THREADS
        badi = plan(r, parts, &why);
        Py_END_ALLOW_THREADS
    } else {
        badi = plan(r, parts, &why);
    }
    Py_ssize_t good = badi < 0 ? r->n : badi;
    Py_ssize_t made = 0;
    for (; made < good; made++) {
        objs[made] = PyBytes_FromStringAndSize(NULL, parts[made].size);
        if (objs[made] == NULL) goto drop;
    }
    if (nogil) {
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t i = 0; i < good; i++) fill(r, &parts[i], i, PyBytes_AS_STRING(objs[i]));
        Py_END_ALLOW_THREADS
    } else {
        for (Py_ssize_t i = 0; i < good; i++) fill(r, &parts[i], i, PyBytes_AS_STRING(objs[i]));
    }
    for (Py_ssize_t i = 0; i < good; i++) {
        if (PyList_Append(out, objs[i]) < 0) goto drop;
    }
    res = badi < 0 ? Py_NewRef(Py_None) : Py_BuildValue("(ns)", badi, why);
drop:
    for (Py_ssize_t i = 0; i < made; i++) Py_DECREF(objs[i]);
out:
    PyMem_Free(parts);
    PyMem_Free(objs);
    return res;
}

static PyObject *render(PyObject *self, PyObject *args) {
    PyObject *out, *bufobj, *so, *oo, *lo, *to;
    long long base;
    int hdr, verify, include_tags, include_meta, include_data;
    if (!PyArg_ParseTuple(args, "O!OLOOOOipppp", &PyList_Type, &out, &bufobj, &base, &so,
                          &oo, &lo, &to, &hdr, &verify, &include_tags, &include_meta,
                          &include_data))
        return NULL;
    if (hdr < FLAGS_BACK || hdr > 64) {
        PyErr_SetString(PyExc_ValueError, "hdr out of range");
        return NULL;
    }
    Py_buffer buf, vs, vo, vl, vt;
    if (PyObject_GetBuffer(bufobj, &buf, PyBUF_SIMPLE) < 0) return NULL;
    PyObject *res = NULL;
    if (get_i64(so, &vs, "seqs") < 0) goto done0;
    if (get_i64(oo, &vo, "offs") < 0) goto done1;
    if (get_i64(lo, &vl, "lens") < 0) goto done2;
    if (get_i64(to, &vt, "tss") < 0) goto done3;
    Py_ssize_t n = vs.len / 8;
    if (vo.len / 8 != n || vl.len / 8 != n || vt.len / 8 != n) {
        PyErr_SetString(PyExc_ValueError, "seqs, offs, lens and tss differ in length");
    } else {
        Run r = {(const unsigned char *)buf.buf, buf.len, (int64_t)base,
                 (const int64_t *)vs.buf, (const int64_t *)vo.buf, (const int64_t *)vl.buf,
                 (const int64_t *)vt.buf, n, hdr, verify, include_tags, include_meta,
                 include_data};
        res = render_run(out, &r);
    }
    PyBuffer_Release(&vt);
done3:
    PyBuffer_Release(&vl);
done2:
    PyBuffer_Release(&vo);
done1:
    PyBuffer_Release(&vs);
done0:
    PyBuffer_Release(&buf);
    return res;
}

static PyMethodDef methods[] = {
    {"render", render, METH_VARARGS,
     "render(out, buf, base, seqs, offs, lens, tss, hdr, verify, include_tags, include_meta,"
     " include_data) -> None | (index, reason)\n\nAppend each record's wire object to out."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_render", "Compiled record rendering (docs/FORMATS.md).", -1,
    methods,
};

PyMODINIT_FUNC PyInit__render(void) {
    const uint16_t probe = 1;
    if (*(const unsigned char *)&probe != 1) {
        PyErr_SetString(PyExc_ImportError, "_render needs a little-endian host");
        return NULL;
    }
    return PyModule_Create(&module);
}
