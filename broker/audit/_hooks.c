/* The audit trail's hot hooks in C: a base class of recorder.CTrail.
 *
 * ``hooks.PyHooks`` is the same class in Python, the reference: both append the same
 * records to the same flat list (events.py); tests/audit/test_hooks_accel.py and
 * test_hooks_equal.py (random call sequences, on both builds below) check that they do.
 * This one exists because the hooks run two or three times per message on the event
 * loop; in C a publish's hook costs half of what it does in Python (146 against 302 ns)
 * and its records are quicker to marshal (docs/performance-audit.md).
 *
 * The fields are the Python class's attributes (member descriptors), so recorder.py
 * reads and assigns them as before: ``buf`` (the flat list, replaced when sealed), ``base``,
 * ``limit``, ``now`` (a float, 0.0 outside a receive batch), ``_scope_all``,
 * ``_vhosts_on``, ``dropped_total``. Past ``limit`` a hook calls ``self._full()``.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <time.h>

/* Two fast paths use CPython's internals: reading a __slots__ member through the type's
 * cache (_PyType_Lookup, PyMemberDescrObject) and writing into a list's spare room
 * (PyListObject.ob_item and .allocated). Both are kept to the versions whose headers were
 * read for them (3.11 to 3.13) and to builds with a GIL; elsewhere the hooks take the
 * public API (PyObject_GetAttr, PyList_Append): the same records, a little slower. */
#ifndef HOOKS_FAST_PATHS  /* -DHOOKS_FAST_PATHS=0: the public API only (a test builds it) */
#if PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030E0000 && !defined(Py_GIL_DISABLED)
#define HOOKS_FAST_PATHS 1
#else
#define HOOKS_FAST_PATHS 0
#endif
#endif

/* record kinds and width: events.py (checked at import by hooks.py) */
#define PUBC 11
#define DELC 12
#define ACKC 13
#define DACK 14
#define WIDTH 12

typedef struct {
    PyObject_HEAD
    PyObject *buf;
    Py_ssize_t base;
    Py_ssize_t limit;
    PyObject *now;
    char scope_all;
    PyObject *vhosts_on;
    Py_ssize_t dropped_total;
} Hooks;

static PyObject *s_audit_ctx, *s_refused_id, *s_name, *s_id, *s_exchange, *s_routing_key,
    *s_properties, *s_body, *s_persistent, *s_message, *s_redelivered, *s_delivery_count,
    *s_audit_pos, *s_queue, *s_entry, *s_consumer, *s_tag, *s_full, *s_channel_ctx,
    *s_message_id, *s_correlation_id, *s_app_id, *s_headers;
static PyObject *k_pubc, *k_delc, *k_ackc, *k_dack, *zero;

/* The records hold objects of their own where they can (the time, ids, tags): marshal
 * looks up every object that something else also references in a table, to write it once
 * and refer to it after, which is most of its cost; an object only the buffer holds is
 * written at once. */
static PyObject *
now_obj(Hooks *self)
{
    PyObject *now = self->now;
    double t;
    if (now != NULL && PyFloat_CheckExact(now) && PyFloat_AS_DOUBLE(now) != 0.0) {
        t = PyFloat_AS_DOUBLE(now);
    } else {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);  /* time.time() */
        t = (double)ts.tv_sec + ts.tv_nsec * 1e-9;
    }
    return PyFloat_FromDouble(t);
}

/* An int of the buffer's own, equal to v (a new reference; v itself when it is not an int
 * or is one of the shared small ints). */
static PyObject *
own_int(PyObject *v)
{
    if (v != NULL && PyLong_CheckExact(v)) {
        int overflow;
        long long n = PyLong_AsLongLongAndOverflow(v, &overflow);
        if (!overflow && (n > 256 || n < -5))
            return PyLong_FromLongLong(n);
        if (n == -1 && PyErr_Occurred())
            PyErr_Clear();
    }
    Py_XINCREF(v);
    return v;
}

/* getattr(obj, name), reading a __slots__ member in place (Message, QueueEntry, Unacked,
 * Consumer): the generic lookup is most of a hook's time otherwise. */
static PyObject *
attr(PyObject *obj, PyObject *name)
{
#if HOOKS_FAST_PATHS
    PyObject *descr = _PyType_Lookup(Py_TYPE(obj), name);  /* the type's cache */
    if (descr != NULL && Py_IS_TYPE(descr, &PyMemberDescr_Type)) {
        PyMemberDef *m = ((PyMemberDescrObject *)descr)->d_member;
        if (m->type == T_OBJECT_EX) {
            PyObject *v = *(PyObject **)((char *)obj + m->offset);
            if (v != NULL)
                return Py_NewRef(v);
        }
    }
#endif
    return PyObject_GetAttr(obj, name);
}

/* getattr(obj, name) as an int of the buffer's own */
static PyObject *
own_int_attr(PyObject *obj, PyObject *name)
{
    PyObject *v = attr(obj, name);
    if (v == NULL)
        return NULL;
    PyObject *own = own_int(v);
    Py_DECREF(v);
    return own;
}

/* channel.audit_ctx, or self._channel_ctx(channel) the first time (a new reference) */
static PyObject *
channel_ctx(Hooks *self, PyObject *channel)
{
    PyObject *ctx = PyObject_GetAttr(channel, s_audit_ctx);
    if (ctx != NULL)
        return ctx;
    if (!PyErr_ExceptionMatches(PyExc_AttributeError))
        return NULL;
    PyErr_Clear();
    return PyObject_CallMethodOneArg((PyObject *)self, s_channel_ctx, channel);
}

/* Appends the WIDTH items (new references, stolen; NULL = None) to buf: in place while the
 * list has room (it over-allocates as it grows), else one by one. */
static int
append(Hooks *self, PyObject **items)
{
    PyObject *buf = self->buf;
    int rc = 0;
    if (buf == NULL || !PyList_CheckExact(buf)) {
        PyErr_SetString(PyExc_TypeError, "audit buffer is not a list");
        rc = -1;
    }
#if HOOKS_FAST_PATHS
    else {
        PyListObject *list = (PyListObject *)buf;
        Py_ssize_t n = Py_SIZE(list);
        if (list->allocated - n >= WIDTH) {
            for (int i = 0; i < WIDTH; i++)
                list->ob_item[n + i] = items[i] ? items[i] : Py_NewRef(Py_None);
            Py_SET_SIZE(list, n + WIDTH);
            return 0;
        }
    }
#endif
    for (int i = 0; i < WIDTH; i++) {
        PyObject *v = items[i] ? items[i] : Py_NewRef(Py_None);
        if (rc == 0 && PyList_Append(buf, v) < 0)
            rc = -1;
        Py_DECREF(v);
    }
    return rc;
}

/* Past the limit: self._full() (seals a chunk or applies the policy). */
static int
check_full(Hooks *self)
{
    if (self->buf != NULL && PyList_GET_SIZE(self->buf) > self->limit) {
        PyObject *r = PyObject_CallMethodNoArgs((PyObject *)self, s_full);
        if (r == NULL)
            return -1;
        Py_DECREF(r);
    }
    return 0;
}

static void
clear_items(PyObject **items)
{
    for (int i = 0; i < WIDTH; i++)
        Py_CLEAR(items[i]);
}

static PyObject *
Hooks_clock_start(Hooks *self, PyObject *unused)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    PyObject *now = PyFloat_FromDouble((double)ts.tv_sec + ts.tv_nsec * 1e-9);
    if (now == NULL)
        return NULL;
    Py_XSETREF(self->now, now);
    Py_RETURN_NONE;
}

static PyObject *
Hooks_clock_stop(Hooks *self, PyObject *unused)
{
    Py_XSETREF(self->now, Py_NewRef(zero));
    Py_RETURN_NONE;
}

/* Does a message's property dict hold anything the trail keeps (events.TRAIL_PROPS)? */
static int
props_kept(PyObject *props)
{
    if (props == Py_None)
        return 0;
    if (!PyDict_Check(props))
        return 1;
    if (PyDict_GET_SIZE(props) == 0)
        return 0;
    PyObject *keys[] = {s_message_id, s_correlation_id, s_app_id, s_headers};
    for (int i = 0; i < 4; i++) {
        int r = PyDict_Contains(props, keys[i]);
        if (r != 0)
            return r;
    }
    return 0;
}

/* The name of queue q when its enqueue of mid is recorded: it is followed (audit_ctx, which
 * is (vhost, queue name)) and did not refuse mid. A new reference; NULL without an error
 * when not recorded. */
static PyObject *
recorded_name(PyObject *q, PyObject *mid)
{
    PyObject *ctx = PyObject_GetAttr(q, s_audit_ctx);
    if (ctx == NULL || ctx == Py_None) {
        Py_XDECREF(ctx);
        return NULL;
    }
    PyObject *refused = PyObject_GetAttr(q, s_refused_id);
    int r = refused == NULL ? -1 : PyObject_RichCompareBool(refused, mid, Py_NE);
    Py_XDECREF(refused);
    PyObject *name = NULL;
    if (r > 0) {
        if (PyTuple_CheckExact(ctx) && PyTuple_GET_SIZE(ctx) == 2)
            name = Py_NewRef(PyTuple_GET_ITEM(ctx, 1));
        else
            name = PyObject_GetAttr(q, s_name);
    }
    Py_DECREF(ctx);
    return name;
}

/* entry.message.id, an int of the buffer's own */
static PyObject *
entry_message_id(PyObject *entry)
{
    PyObject *message = attr(entry, s_message);
    if (message == NULL)
        return NULL;
    PyObject *mid = own_int_attr(message, s_id);
    Py_DECREF(message);
    return mid;
}

/* A publish's ``queues`` slot: None, the one recorded queue's name, or a list of several
 * (a new reference; NULL on an error). */
static PyObject *
recorded_into(PyObject *queues, PyObject *message)
{
    PyObject *fast = PySequence_Fast(queues, "queues");
    if (fast == NULL)
        return NULL;
    Py_ssize_t nq = PySequence_Fast_GET_SIZE(fast);
    PyObject **qs = PySequence_Fast_ITEMS(fast);
    PyObject *into = NULL, *mid = nq ? attr(message, s_id) : NULL;
    if (nq && mid == NULL)
        goto fail;
    for (Py_ssize_t i = 0; i < nq; i++) {
        PyObject *name = recorded_name(qs[i], mid);
        if (name == NULL) {
            if (PyErr_Occurred())
                goto fail;
            continue;
        }
        if (nq == 1) {
            into = name;
            break;
        }
        if (into == NULL && (into = PyList_New(0)) == NULL) {
            Py_DECREF(name);
            goto fail;
        }
        int rc = PyList_Append(into, name);
        Py_DECREF(name);
        if (rc < 0)
            goto fail;
    }
    Py_DECREF(fast);
    Py_XDECREF(mid);
    return into ? into : Py_NewRef(Py_None);
fail:
    Py_DECREF(fast);
    Py_XDECREF(mid);
    Py_XDECREF(into);
    return NULL;
}

/* METH_FASTCALL methods: exactly ``want`` arguments, else TypeError(usage). */
static int
nargs_ok(Py_ssize_t nargs, Py_ssize_t want, const char *usage)
{
    if (nargs == want)
        return 1;
    PyErr_SetString(PyExc_TypeError, usage);
    return 0;
}

static PyObject *
Hooks_published(Hooks *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (!nargs_ok(nargs, 5, "published(channel, message, queues, outcome, seq)"))
        return NULL;
    PyObject *channel = args[0], *message = args[1], *queues = args[2];
    PyObject *items[WIDTH] = {NULL};
    PyObject *ctx = NULL;
    PyObject *into = recorded_into(queues, message);
    if (into == NULL)
        return NULL;
    ctx = channel_ctx(self, channel);
    if (ctx == NULL)
        goto fail;
    if (!self->scope_all) {
        if (!PyTuple_Check(ctx) || PyTuple_GET_SIZE(ctx) < 1) {
            PyErr_SetString(PyExc_TypeError, "audit_ctx is not a tuple");
            goto fail;
        }
        PyObject *on = self->vhosts_on ? PyDict_GetItemWithError(self->vhosts_on,
                                                                 PyTuple_GET_ITEM(ctx, 0))
                                       : NULL;
        if (on == NULL && PyErr_Occurred())
            goto fail;
        int truth = on == NULL ? 0 : PyObject_IsTrue(on);
        if (truth < 0)
            goto fail;
        if (!truth) {
            Py_DECREF(ctx);
            Py_XDECREF(into);
            Py_RETURN_NONE;
        }
    }
    items[0] = Py_NewRef(k_pubc);
    if ((items[1] = now_obj(self)) == NULL)
        goto fail_items;
    items[2] = ctx;
    ctx = NULL;
    if ((items[3] = attr(message, s_exchange)) == NULL ||
        (items[4] = attr(message, s_routing_key)) == NULL ||
        (items[5] = own_int_attr(message, s_id)) == NULL ||
        (items[6] = attr(message, s_properties)) == NULL)
        goto fail_items;
    int kept = props_kept(items[6]);
    if (kept < 0)
        goto fail_items;
    if (!kept)  /* nothing the trail keeps (the dict would outlive its message) */
        Py_SETREF(items[6], Py_NewRef(Py_None));
    PyObject *body = attr(message, s_body);
    if (body == NULL)
        goto fail_items;
    Py_ssize_t size = PyObject_Length(body);
    Py_DECREF(body);
    if (size < 0 || (items[7] = PyLong_FromSsize_t(size)) == NULL)
        goto fail_items;
    if ((items[8] = attr(message, s_persistent)) == NULL)
        goto fail_items;
    if ((items[9] = own_int(args[4])) == NULL)
        goto fail_items;
    items[10] = into;
    into = NULL;
    items[11] = Py_NewRef(args[3]);
    if (append(self, items) < 0 || check_full(self) < 0)
        return NULL;
    Py_RETURN_NONE;
fail_items:
    clear_items(items);
fail:
    Py_XDECREF(into);
    Py_XDECREF(ctx);
    return NULL;
}

/* queue.audit_ctx: a new reference, NULL with no error when the queue is not followed */
static PyObject *
queue_ctx(PyObject *queue)
{
    PyObject *qctx = PyObject_GetAttr(queue, s_audit_ctx);
    if (qctx == NULL) {
        if (PyErr_ExceptionMatches(PyExc_AttributeError))
            PyErr_Clear();
        return NULL;
    }
    if (qctx == Py_None) {
        Py_DECREF(qctx);
        return NULL;
    }
    return qctx;
}

static PyObject *
Hooks_delivered(Hooks *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (!nargs_ok(nargs, 5, "delivered(channel, ctag, tag, queue, entry)"))
        return NULL;
    PyObject *channel = args[0], *entry = args[4];
    PyObject *items[WIDTH] = {NULL};
    PyObject *qctx = queue_ctx(args[3]);
    if (qctx == NULL)
        return PyErr_Occurred() ? NULL : PyLong_FromLong(-1);
    PyObject *ctx = channel_ctx(self, channel);
    if (ctx == NULL) {
        Py_DECREF(qctx);
        return NULL;
    }
    if (self->buf == NULL || !PyList_CheckExact(self->buf)) {
        Py_DECREF(qctx);
        Py_DECREF(ctx);
        PyErr_SetString(PyExc_TypeError, "audit buffer is not a list");
        return NULL;
    }
    Py_ssize_t at = self->base + PyList_GET_SIZE(self->buf);
    items[0] = Py_NewRef(k_delc);
    items[2] = qctx;
    items[8] = ctx;
    if ((items[1] = now_obj(self)) == NULL)
        goto fail;
    if ((items[3] = entry_message_id(entry)) == NULL)
        goto fail;
    items[4] = Py_NewRef(args[1]);
    if ((items[5] = own_int(args[2])) == NULL)
        goto fail;
    if ((items[6] = attr(entry, s_redelivered)) == NULL ||
        (items[7] = attr(entry, s_delivery_count)) == NULL)
        goto fail;
    if (append(self, items) < 0)
        return NULL;
    if (self->buf != NULL && PyList_GET_SIZE(self->buf) > self->limit) {
        Py_ssize_t dropped = self->dropped_total;
        if (check_full(self) < 0)
            return NULL;
        if (self->dropped_total != dropped)  /* this very record (the drop policy) */
            return PyLong_FromLong(-1);
    }
    return PyLong_FromSsize_t(at);
fail:
    clear_items(items);
    return NULL;
}

static PyObject *
Hooks_acked(Hooks *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (!nargs_ok(nargs, 2, "acked(channel, item)"))
        return NULL;
    PyObject *channel = args[0], *item = args[1];
    PyObject *items[WIDTH] = {NULL};
    PyObject *pos = attr(item, s_audit_pos);
    if (pos == NULL)
        return NULL;
    Py_ssize_t at = PyLong_AsSsize_t(pos);
    Py_DECREF(pos);
    if (at == -1 && PyErr_Occurred())
        return NULL;
    at -= self->base;
    PyObject *buf = self->buf;
    /* Still in the buffer, the delivery's record takes the ack too (events.DACK). */
    if (at >= 0 && buf != NULL && PyList_CheckExact(buf) && at + WIDTH <= PyList_GET_SIZE(buf)) {
        PyObject *kind = PyList_GET_ITEM(buf, at);
        if (kind == k_delc || (PyLong_CheckExact(kind) && PyLong_AsLong(kind) == DELC)) {
            PyObject *t = now_obj(self);
            if (t == NULL)
                return NULL;
            PyList_SetItem(buf, at + 9, t);  /* steals t */
            PyList_SetItem(buf, at, Py_NewRef(k_dack));
            Py_RETURN_NONE;
        }
    }
    PyObject *queue = attr(item, s_queue);
    if (queue == NULL)
        return NULL;
    PyObject *qctx = queue_ctx(queue);
    Py_DECREF(queue);
    if (qctx == NULL) {
        if (PyErr_Occurred())
            return NULL;
        Py_RETURN_NONE;
    }
    items[0] = Py_NewRef(k_ackc);
    items[2] = qctx;
    if ((items[1] = now_obj(self)) == NULL)
        goto fail;
    PyObject *entry = attr(item, s_entry);
    if (entry == NULL)
        goto fail;
    items[3] = entry_message_id(entry);
    Py_DECREF(entry);
    if (items[3] == NULL)
        goto fail;
    PyObject *consumer = attr(item, s_consumer);
    if (consumer == NULL)
        goto fail;
    if (consumer != Py_None) {
        items[4] = attr(consumer, s_tag);
        Py_DECREF(consumer);
        if (items[4] == NULL)
            goto fail;
    } else {
        Py_DECREF(consumer);
    }
    if ((items[5] = own_int_attr(item, s_tag)) == NULL ||
        (items[6] = channel_ctx(self, channel)) == NULL)
        goto fail;
    if (append(self, items) < 0 || check_full(self) < 0)
        return NULL;
    Py_RETURN_NONE;
fail:
    clear_items(items);
    return NULL;
}

static int
Hooks_init(Hooks *self, PyObject *args, PyObject *kwds)
{
    /* the subclass's __init__ assigns the fields; they start empty */
    if (self->buf == NULL && (self->buf = PyList_New(0)) == NULL)
        return -1;
    if (self->now == NULL)
        self->now = Py_NewRef(zero);
    if (self->vhosts_on == NULL && (self->vhosts_on = PyDict_New()) == NULL)
        return -1;
    return 0;
}

static PyObject *
Hooks_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    Hooks *self = (Hooks *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->limit = PY_SSIZE_T_MAX;
    if (Hooks_init(self, NULL, NULL) < 0) {
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

static int
Hooks_traverse(Hooks *self, visitproc visit, void *arg)
{
    Py_VISIT(self->buf);
    Py_VISIT(self->now);
    Py_VISIT(self->vhosts_on);
    Py_VISIT(Py_TYPE(self));
    return 0;
}

static int
Hooks_clear(Hooks *self)
{
    Py_CLEAR(self->buf);
    Py_CLEAR(self->now);
    Py_CLEAR(self->vhosts_on);
    return 0;
}

static void
Hooks_dealloc(Hooks *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    Hooks_clear(self);
    tp->tp_free((PyObject *)self);
    Py_DECREF(tp);
}

static PyMemberDef Hooks_members[] = {
    {"buf", T_OBJECT_EX, offsetof(Hooks, buf), 0, "the flat buffer: WIDTH slots per event"},
    {"base", T_PYSSIZET, offsetof(Hooks, base), 0, "the position of buf[0] among all slots"},
    {"limit", T_PYSSIZET, offsetof(Hooks, limit), 0, "past this many slots, _full()"},
    {"now", T_OBJECT_EX, offsetof(Hooks, now), 0, "the receive batch's time, 0.0 outside"},
    {"_scope_all", T_BOOL, offsetof(Hooks, scope_all), 0, "every vhost is audited"},
    {"_vhosts_on", T_OBJECT_EX, offsetof(Hooks, vhosts_on), 0, "vhost -> audited queues"},
    {"dropped_total", T_PYSSIZET, offsetof(Hooks, dropped_total), 0, "events dropped"},
    {NULL}
};

static PyMethodDef Hooks_methods[] = {
    {"clock_start", (PyCFunction)Hooks_clock_start, METH_NOARGS,
     "A session starts handling a receive batch: its events share this time."},
    {"clock_stop", (PyCFunction)Hooks_clock_stop, METH_NOARGS,
     "The batch is handled: events from timers and other tasks read the clock."},
    {"published", (PyCFunction)(void (*)(void))Hooks_published, METH_FASTCALL,
     "published(channel, message, queues, outcome, seq): see hooks.PyHooks."},
    {"delivered", (PyCFunction)(void (*)(void))Hooks_delivered, METH_FASTCALL,
     "delivered(channel, ctag, tag, queue, entry) -> int: see hooks.PyHooks."},
    {"acked", (PyCFunction)(void (*)(void))Hooks_acked, METH_FASTCALL,
     "acked(channel, item): see hooks.PyHooks."},
    {NULL}
};

static PyType_Slot Hooks_slots[] = {
    {Py_tp_doc, "The audit trail's hot hooks (the C version of hooks.PyHooks)."},
    {Py_tp_new, Hooks_new},
    {Py_tp_init, Hooks_init},
    {Py_tp_dealloc, Hooks_dealloc},
    {Py_tp_traverse, Hooks_traverse},
    {Py_tp_clear, Hooks_clear},
    {Py_tp_members, Hooks_members},
    {Py_tp_methods, Hooks_methods},
    {0, NULL}
};

static PyType_Spec Hooks_spec = {
    .name = "broker.audit._hooks.Hooks",
    .basicsize = sizeof(Hooks),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .slots = Hooks_slots,
};

static int
intern(PyObject **slot, const char *text)
{
    *slot = PyUnicode_InternFromString(text);
    return *slot == NULL ? -1 : 0;
}

static int
hooks_exec(PyObject *module)
{
    if (intern(&s_audit_ctx, "audit_ctx") || intern(&s_refused_id, "refused_id") ||
        intern(&s_name, "name") || intern(&s_id, "id") || intern(&s_exchange, "exchange") ||
        intern(&s_routing_key, "routing_key") || intern(&s_properties, "properties") ||
        intern(&s_body, "body") || intern(&s_persistent, "persistent") ||
        intern(&s_message, "message") || intern(&s_redelivered, "redelivered") ||
        intern(&s_delivery_count, "delivery_count") || intern(&s_audit_pos, "audit_pos") ||
        intern(&s_queue, "queue") || intern(&s_entry, "entry") ||
        intern(&s_consumer, "consumer") || intern(&s_tag, "tag") || intern(&s_full, "_full") ||
        intern(&s_channel_ctx, "_channel_ctx") || intern(&s_message_id, "message_id") ||
        intern(&s_correlation_id, "correlation_id") || intern(&s_app_id, "app_id") ||
        intern(&s_headers, "headers"))
        return -1;
    if ((k_pubc = PyLong_FromLong(PUBC)) == NULL || (k_delc = PyLong_FromLong(DELC)) == NULL ||
        (k_ackc = PyLong_FromLong(ACKC)) == NULL || (k_dack = PyLong_FromLong(DACK)) == NULL ||
        (zero = PyFloat_FromDouble(0.0)) == NULL)
        return -1;
    PyObject *type = PyType_FromModuleAndSpec(module, &Hooks_spec, NULL);
    if (type == NULL)
        return -1;
    if (PyModule_AddObject(module, "Hooks", type) < 0) {
        Py_DECREF(type);
        return -1;
    }
    PyObject *kinds = Py_BuildValue("(iiiii)", PUBC, DELC, ACKC, DACK, WIDTH);
    if (kinds == NULL || PyModule_AddObject(module, "LAYOUT", kinds) < 0) {
        Py_XDECREF(kinds);
        return -1;
    }
    return 0;
}

static PyModuleDef_Slot hooks_module_slots[] = {
    {Py_mod_exec, hooks_exec},
    {0, NULL}
};

static struct PyModuleDef hooks_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "broker.audit._hooks",
    .m_doc = "The audit trail's hot hooks in C (see hooks.py).",
    .m_size = 0,
    .m_slots = hooks_module_slots,
};

PyMODINIT_FUNC
PyInit__hooks(void)
{
    return PyModuleDef_Init(&hooks_module);
}
