/*
 * clockstep.c: an LD_PRELOAD shim that steps a process's WALL clock, for fault tests.
 *
 * gettimeofday(), time(), timespec_get(TIME_UTC) and clock_gettime() on the realtime-based
 * clocks (CLOCK_REALTIME, CLOCK_REALTIME_COARSE, CLOCK_REALTIME_ALARM, CLOCK_TAI) return the real
 * time plus an offset. CLOCK_MONOTONIC*, CLOCK_BOOTTIME* and the CPU-time clocks are passed
 * through unchanged, as after an NTP step. Redis's TIME and its key expiry follow the offset.
 *
 * The offset file: its path is in env REDQUORUM_CLOCK_OFFSET_FILE; it holds exactly 8 bytes, a
 * little-endian signed 64-bit number of MILLISECONDS (positive: ahead of real time). It is
 * mapped MAP_SHARED read-only once (at load, or at the first clock call if that comes first) and
 * read with an atomic load on every call, so a test steps the clock by rewriting those 8 bytes
 * in place. Never truncate or replace the file: the mapping follows the inode. No variable, no
 * file, or a failed mapping: offset 0 (the shim is then a pass-through).
 *
 * Real time comes from the kernel's vDSO clock_gettime, looked up in the vDSO's own ELF symbol
 * table (getauxval(AT_SYSINFO_EHDR)), or, where there is no vDSO, from the raw clock_gettime
 * system call. Never from libc's clock_gettime (the symbol this file replaces) and never through
 * dlsym: libfaketime's dlsym path recurses inside jemalloc's start-up in Debian's redis-server.
 * The vDSO matters for speed: Redis reads its clocks several times per command, and a real
 * system call costs ~10x a vDSO call. Nothing here allocates memory.
 */
#define _GNU_SOURCE
#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <link.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/auxv.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

typedef long (*vdso_clock_gettime_fn)(clockid_t, struct timespec *);

/* Set at init (benign races: every thread computes the same values), read atomically. */
static vdso_clock_gettime_fn vdso_clock_gettime = 0;
static const volatile int64_t *offset_map = 0;
static int initialized = 0;

/* The vDSO's clock_gettime, or 0. Walks the vDSO's dynamic symbol table (DT_HASH gives the
 * symbol count; the kernel links its vDSO with both hash styles). */
static vdso_clock_gettime_fn find_vdso_clock_gettime(void) {
    uintptr_t base = (uintptr_t)getauxval(AT_SYSINFO_EHDR);
    if (!base) return 0;
    const ElfW(Ehdr) *eh = (const ElfW(Ehdr) *)base;
    const ElfW(Phdr) *ph = (const ElfW(Phdr) *)(base + eh->e_phoff);
    uintptr_t load = 0;
    const ElfW(Dyn) *dyn = 0;
    int have_load = 0;
    for (int i = 0; i < eh->e_phnum; i++) {
        if (ph[i].p_type == PT_LOAD && !have_load) {
            load = base + ph[i].p_offset - ph[i].p_vaddr;
            have_load = 1;
        } else if (ph[i].p_type == PT_DYNAMIC) {
            dyn = (const ElfW(Dyn) *)(base + ph[i].p_offset);
        }
    }
    if (!have_load || !dyn) return 0;
    const ElfW(Sym) *symtab = 0;
    const char *strtab = 0;
    const ElfW(Word) *hash = 0;
    for (; dyn->d_tag != DT_NULL; dyn++) {
        if (dyn->d_tag == DT_SYMTAB) symtab = (const ElfW(Sym) *)(load + dyn->d_un.d_ptr);
        else if (dyn->d_tag == DT_STRTAB) strtab = (const char *)(load + dyn->d_un.d_ptr);
        else if (dyn->d_tag == DT_HASH) hash = (const ElfW(Word) *)(load + dyn->d_un.d_ptr);
    }
    if (!symtab || !strtab || !hash) return 0;
    ElfW(Word) nsyms = hash[1]; /* nchain == number of symbols */
    for (ElfW(Word) i = 0; i < nsyms; i++) {
        const ElfW(Sym) *s = &symtab[i];
        if ((s->st_info & 0xf) != STT_FUNC /* ST_TYPE */ || s->st_shndx == SHN_UNDEF) continue;
        const char *name = strtab + s->st_name;
        /* x86_64 and most others; arm64 calls it __kernel_clock_gettime. */
        if (strcmp(name, "__vdso_clock_gettime") == 0 || strcmp(name, "__kernel_clock_gettime") == 0)
            return (vdso_clock_gettime_fn)(load + s->st_value);
    }
    return 0;
}

static void init(void) {
    __atomic_store_n(&vdso_clock_gettime, find_vdso_clock_gettime(), __ATOMIC_RELEASE);
    const char *path = getenv("REDQUORUM_CLOCK_OFFSET_FILE");
    if (path && *path) {
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd >= 0) {
            void *m = mmap(0, sizeof(int64_t), PROT_READ, MAP_SHARED, fd, 0);
            close(fd);
            if (m != MAP_FAILED) {
                const volatile int64_t *expected = 0;
                /* Two threads racing through init: keep one mapping, drop the other. */
                if (!__atomic_compare_exchange_n(&offset_map, &expected, (const volatile int64_t *)m,
                                                 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
                    munmap(m, sizeof(int64_t));
            }
        }
    }
    __atomic_store_n(&initialized, 1, __ATOMIC_RELEASE);
}

/* Runs at load, before the program's own constructors and threads. */
__attribute__((constructor)) static void clockstep_init(void) { init(); }

/* In case some clock call comes before our constructor. */
static inline void ensure_init(void) {
    if (__builtin_expect(!__atomic_load_n(&initialized, __ATOMIC_ACQUIRE), 0)) init();
}

static inline int64_t offset_ms(void) {
    const volatile int64_t *m = __atomic_load_n(&offset_map, __ATOMIC_ACQUIRE);
    return m ? __atomic_load_n(m, __ATOMIC_RELAXED) : 0;
}

/* The real clock, errno-style (0, or -1 with errno set). */
static inline int real_clock_gettime(clockid_t id, struct timespec *ts) {
    vdso_clock_gettime_fn f = __atomic_load_n(&vdso_clock_gettime, __ATOMIC_ACQUIRE);
    if (f) {
        long r = f(id, ts); /* the vDSO returns -errno, it does not set errno */
        if (r < 0) {
            errno = (int)-r;
            return -1;
        }
        return 0;
    }
    return (int)syscall(SYS_clock_gettime, id, ts);
}

static inline int is_realtime(clockid_t id) {
    return id == CLOCK_REALTIME || id == CLOCK_REALTIME_COARSE || id == CLOCK_REALTIME_ALARM ||
           id == CLOCK_TAI;
}

static inline void add_offset(struct timespec *ts, int64_t off) {
    int64_t sec = (int64_t)ts->tv_sec + off / 1000;
    int64_t ns = (int64_t)ts->tv_nsec + (off % 1000) * 1000000LL; /* % keeps the sign of off */
    if (ns < 0) {
        ns += 1000000000LL;
        sec -= 1;
    } else if (ns >= 1000000000LL) {
        ns -= 1000000000LL;
        sec += 1;
    }
    ts->tv_sec = (time_t)sec;
    ts->tv_nsec = (long)ns;
}

int clock_gettime(clockid_t id, struct timespec *ts) {
    ensure_init();
    int r = real_clock_gettime(id, ts);
    if (r == 0 && is_realtime(id)) {
        int64_t off = offset_ms();
        if (off != 0) add_offset(ts, off);
    }
    return r;
}

/* glibc declares tv non-null and the timezone as void * (obsolete: ignored). */
int gettimeofday(struct timeval *restrict tv, void *restrict tz) {
    (void)tz;
    struct timespec ts;
    int r = clock_gettime(CLOCK_REALTIME, &ts);
    if (r == 0) {
        tv->tv_sec = ts.tv_sec;
        tv->tv_usec = ts.tv_nsec / 1000;
    }
    return r;
}

time_t time(time_t *t) {
    struct timespec ts;
    if (clock_gettime(CLOCK_REALTIME, &ts) != 0) return (time_t)-1;
    if (t) *t = ts.tv_sec;
    return ts.tv_sec;
}

/* C11; glibc's own calls clock_gettime internally, past this shim. */
int timespec_get(struct timespec *ts, int base) {
    if (base != TIME_UTC || clock_gettime(CLOCK_REALTIME, ts) != 0) return 0;
    return base;
}
