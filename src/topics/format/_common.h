/*
 * Helpers shared by the compiled parts of the codec (_render.c, _codec.c): the
 * frame layout, little-endian field access and the int64 column buffers they
 * take from numpy.
 * Both modules check at import that the host is little-endian.
 */
#ifndef TOPICS_FORMAT_COMMON_H
#define TOPICS_FORMAT_COMMON_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

/* The frame layout both modules read or write (docs/FORMATS.md, "Frames"; the
   Python side is topics/format/frame.py). */
#define APPEND 1
#define F_HAS_TAG 0x01
#define F_HAS_NODE 0x02
#define F_DURABLE 0x04
#define F_HAS_META 0x08
#define F_BATCH_MORE 0x10
#define F_RECORD_MASK (F_HAS_TAG | F_HAS_NODE | F_HAS_META)
#define WAL_HDR 38 /* frame_len u32, type, flags, topic_id, seq, ts, the three lengths */
#define CRC 8      /* the XXH3-64 that ends every frame */

static inline uint16_t rd16(const unsigned char *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static inline uint32_t rd32(const unsigned char *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}
static inline uint64_t rd64(const unsigned char *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}
static inline void wr16(char *p, uint16_t v) { memcpy(p, &v, 2); }
static inline void wr32(char *p, uint32_t v) { memcpy(p, &v, 4); }
static inline void wr64(char *p, uint64_t v) { memcpy(p, &v, 8); }

/* Export `obj` as a C-contiguous buffer of int64 (numpy int64 arrays, or any
   buffer of format q/l with 8-byte items); TypeError otherwise. */
static inline int get_i64(PyObject *obj, Py_buffer *view, const char *what) {
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) return -1;
    const char *f = view->format;
    if (f != NULL && (*f == '<' || *f == '=')) f++;
    if (view->itemsize != 8 || f == NULL || (strcmp(f, "q") != 0 && strcmp(f, "l") != 0)) {
        PyErr_Format(PyExc_TypeError, "%s must be a contiguous int64 buffer", what);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

#endif
