/* kernelmap._cpuclock: a native thread in this process that reads every other thread's CPU-time clock
 * (CLOCK_MONOTONIC beside their sum) about every PERIOD_US, without Python's interpreter lock, until stop().
 * kernelmap/cpusampler.py is its user and holds its Python twin (PyThreadSampler); see SAMPLER_RULE there.
 *
 * Why per thread and in this process: Linux brings a thread's CPU time up to date when that thread's own
 * clock is read (task_sched_runtime), but the process-wide clock of another process sums its threads' times
 * as of their last tick or switch, so a running thread's time arrives in steps of a scheduler tick (measured
 * on the project's VM: 4 ms, rates of up to 13.8 cores on 2); and a thread's clock is readable only from its
 * own process. */
#define _GNU_SOURCE
#include <Python.h>
#include <dirent.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define MAX_THREADS 4096
#define DISCOVER_EVERY 16 /* samples between two reads of /proc/self/task */

typedef struct {
    pid_t tid;
    clockid_t clock;
    int64_t last;
    int live;
    int64_t cur;           /* this sample's reading */
    unsigned long emitted; /* the last sample whose reading is in the per-thread rows, +1 (0: none yet) */
} Thread;

static pthread_t sampler;
static atomic_int stopping;
static int running;
static long period_ns;
static pid_t own_tid;
static Thread threads[MAX_THREADS];
static int n_threads;
static int64_t retired;  /* the last reading of every thread that has ended: the sum never goes back */
static int64_t *rows;    /* per sample: monotonic ns, the other threads' CPU ns, this thread's own, the main thread's */
static size_t n_rows, cap_rows;
static int64_t *trows;   /* per-thread rows (THREAD_ROWS_RULE in cpusampler.py): monotonic ns, tid, CPU ns */
static size_t n_trows, cap_trows;
static unsigned long n_samples;
static int64_t prev_stamp; /* the previous sample's monotonic ns */
static int64_t own_cpu_ns;
static int overflow;

static int64_t ns_of(clockid_t c) {
    struct timespec ts;
    if (clock_gettime(c, &ts) != 0) return -1;
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static clockid_t thread_clock(pid_t tid) { /* MAKE_THREAD_CPUCLOCK(tid, CPUCLOCK_SCHED) */
    return (clockid_t)((~(unsigned int)tid) << 3 | 6u);
}

static void discover(void) {
    DIR *d = opendir("/proc/self/task");
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
        pid_t tid = (pid_t)atoi(e->d_name);
        if (tid == own_tid) continue;
        int known = 0;
        for (int i = 0; i < n_threads && !known; i++) known = threads[i].tid == tid;
        if (known || n_threads >= MAX_THREADS) {
            overflow |= !known;
            continue;
        }
        threads[n_threads++] = (Thread){tid, thread_clock(tid), 0, 1, 0, 0};
    }
    closedir(d);
}

static int64_t cpu_sum(void) {
    int64_t sum = retired;
    for (int i = 0; i < n_threads; i++) {
        Thread *t = &threads[i];
        if (!t->live) continue;
        int64_t v = ns_of(t->clock);
        if (v < 0) { /* the thread ended: its last reading stays in the sum */
            t->live = 0;
            retired += t->last;
            sum += t->last;
            continue;
        }
        t->cur = v;
        sum += v;
    }
    return sum;
}

static int64_t main_cpu(void) { /* the process's first thread (tid = pid): the interpreter's main thread */
    for (int i = 0; i < n_threads; i++)
        if (threads[i].tid == getpid()) return threads[i].last;
    return 0;
}

/* Room for one more row of `width` in *buf (doubling it); 0 where the allocation failed (overflow is set). */
static int room(int64_t **buf, size_t n, size_t *cap, int width) {
    if (n + 1 <= *cap) return 1;
    size_t grown_cap = *cap ? *cap * 2 : 65536;
    int64_t *grown = realloc(*buf, grown_cap * width * sizeof(int64_t));
    if (!grown) {
        overflow = 1;
        return 0;
    }
    *buf = grown;
    *cap = grown_cap;
    return 1;
}

static void append(int64_t t, int64_t c) {
    if (!room(&rows, n_rows, &cap_rows, 4)) return;
    rows[4 * n_rows] = t;
    rows[4 * n_rows + 1] = c;
    rows[4 * n_rows + 2] = ns_of(CLOCK_THREAD_CPUTIME_ID);
    rows[4 * n_rows + 3] = main_cpu();
    n_rows++;
}

static void thread_row(int64_t t, pid_t tid, int64_t v) {
    if (!room(&trows, n_trows, &cap_trows, 3)) return;
    trows[3 * n_trows] = t;
    trows[3 * n_trows + 1] = tid;
    trows[3 * n_trows + 2] = v;
    n_trows++;
}

/* Each thread's reading where it moved (and the unchanged reading of the sample before, so that a reader's line
 * between two rows is the thread's own), its first, and every live thread's at the last sample (final). */
static void thread_rows(int64_t stamp, int final) {
    unsigned long k = n_samples + 1;
    for (int i = 0; i < n_threads; i++) {
        Thread *t = &threads[i];
        if (!t->live) continue;
        int moved = t->emitted && t->cur != t->last;
        if (moved && t->emitted < k - 1) thread_row(prev_stamp, t->tid, t->last);
        if (!t->emitted || moved || (final && t->emitted < k)) {
            thread_row(stamp, t->tid, t->cur);
            t->emitted = k;
        }
        t->last = t->cur;
    }
}

static void sample_final(int final) { /* stamped at the middle of its reads (a preempted read moves it less) */
    int64_t t0 = ns_of(CLOCK_MONOTONIC);
    int64_t c = cpu_sum();
    int64_t t1 = ns_of(CLOCK_MONOTONIC);
    int64_t stamp = t0 + (t1 - t0) / 2;
    thread_rows(stamp, final);
    append(stamp, c);
    prev_stamp = stamp;
    n_samples++;
}

static void sample(void) { sample_final(0); }

static void *run(void *arg) {
    (void)arg;
    own_tid = (pid_t)syscall(SYS_gettid);
    discover();
    struct timespec wait = {period_ns / 1000000000L, period_ns % 1000000000L};
    for (unsigned long k = 0; !atomic_load(&stopping); k++) {
        if (k && k % DISCOVER_EVERY == 0) discover();
        sample();
        nanosleep(&wait, NULL);
    }
    sample_final(1); /* one read after stop(): the last marked step lies within the samples */
    own_cpu_ns = ns_of(CLOCK_THREAD_CPUTIME_ID);
    return NULL;
}

static PyObject *start(PyObject *self, PyObject *args) {
    long period_us;
    if (!PyArg_ParseTuple(args, "l", &period_us)) return NULL;
    if (running) {
        PyErr_SetString(PyExc_RuntimeError, "the CPU sampler is already running");
        return NULL;
    }
    if (period_us < 1) {
        PyErr_SetString(PyExc_ValueError, "period_us must be at least 1");
        return NULL;
    }
    period_ns = period_us * 1000L;
    n_threads = 0;
    retired = 0;
    n_rows = 0;
    n_trows = 0;
    n_samples = 0;
    prev_stamp = 0;
    overflow = 0;
    own_cpu_ns = 0;
    atomic_store(&stopping, 0);
    if (pthread_create(&sampler, NULL, run, NULL) != 0) {
        PyErr_SetString(PyExc_OSError, "cannot start the CPU sampler's thread");
        return NULL;
    }
    running = 1;
    Py_RETURN_NONE;
}

/* stop() -> (bytes of int64 rows of 4, the sampler thread's own CPU ns, threads read, whether any was missed,
 *           bytes of int64 per-thread rows of 3) */
static PyObject *stop(PyObject *self, PyObject *args) {
    if (!running) {
        PyErr_SetString(PyExc_RuntimeError, "the CPU sampler is not running");
        return NULL;
    }
    atomic_store(&stopping, 1);
    Py_BEGIN_ALLOW_THREADS
    pthread_join(sampler, NULL);
    Py_END_ALLOW_THREADS
    running = 0;
    PyObject *data = PyBytes_FromStringAndSize((const char *)rows, (Py_ssize_t)(n_rows * 4 * sizeof(int64_t)));
    free(rows);
    rows = NULL;
    cap_rows = 0;
    if (!data) return NULL;
    PyObject *tdata = PyBytes_FromStringAndSize((const char *)trows, (Py_ssize_t)(n_trows * 3 * sizeof(int64_t)));
    free(trows);
    trows = NULL;
    cap_trows = 0;
    if (!tdata) {
        Py_DECREF(data);
        return NULL;
    }
    return Py_BuildValue("(NLiON)", data, (long long)own_cpu_ns, n_threads, overflow ? Py_True : Py_False, tdata);
}

static PyMethodDef methods[] = {
    {"start", start, METH_VARARGS, "start(period_us): start the sampler thread"},
    {"stop", stop, METH_NOARGS,
     "stop() -> (rows, own_cpu_ns, threads, missed, thread_rows): stop it and take its samples"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_cpuclock", NULL, -1, methods};

PyMODINIT_FUNC PyInit__cpuclock(void) { return PyModule_Create(&module); }
