/*
 * rmq_core.c - read-only decoder of Apache RocketMQ store files (CommitLog + ConsumeQueue) and of
 * pull answers, into Arrow column buffers, and the pulls themselves (requests sent ahead on a TCP
 * connection, answers read and joined). The store layout it reads is documented in rmq_layout.h,
 * the remoting frames in core/netpull.c, the sink's batch bodies in core/sinkenc.c, the brokers'
 * statistics answers in core/stats.c; the API (and
 * every error code) in rmq_core.h.
 *
 * One translation unit made of the units under core/, one concern each, included in dependency
 * order: the scans' hot paths inline across them (record parsing, unit checks, row emission) as
 * they did when this was one file. The units are not compiled on their own.
 */
#define _GNU_SOURCE
#include "rmq_core.h"
#include "rmq_layout.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

_Static_assert(RMQ_NBUF == 34, "rmq_batch.bufs size must match RMQ_NBUF");

#define ALIGN 64

#if defined(__SSE2__) && !defined(RMQ_PORTABLE)
#include <emmintrin.h>
#define RMQ_SSE2 1
#else
#define RMQ_SSE2 0
#endif

#define likely(x) __builtin_expect(!!(x), 1)
#define unlikely(x) __builtin_expect(!!(x), 0)


#include "core/base.c"
#include "core/records.c"
#include "core/consumequeue.c"
#include "core/cqpoll.c"
#include "core/buffers.c"
#include "core/rows.c"
#include "core/scan.c"
#include "core/pull.c"
#include "core/tls.c"
#include "core/netpull.c"
#include "core/sql92.c"
#include "core/sinkenc.c"
#include "core/traces.c"
#include "core/stats.c"
#include "core/export.c"
