/*
 * portmap.c: an LD_PRELOAD shim that sends a process's TCP connections to 127.0.0.1:<from> to
 * 127.0.0.1:<to> instead, for fault campaigns: every client process lists the SAME node URLs
 * (as a real deployment does, so the cluster's identity holds), yet each one reaches the nodes
 * through its own fault proxies, so a partition can cut one client off from a node while the
 * others still reach it.
 *
 * The map: env REDQUORUM_PORT_MAP = "from:to,from:to,..." (decimal ports), read once at load.
 * connect() on an AF_INET socket to 127.0.0.1 with a mapped port goes to the mapped port;
 * everything else is passed through. The real connect is the raw system call (no dlsym).
 * Nothing here allocates memory.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#define MAX_PORTS 64

static unsigned short map_from[MAX_PORTS];
static unsigned short map_to[MAX_PORTS];
static int map_len = 0;

static unsigned long parse_port(const char **p) {
    unsigned long v = 0;
    while (**p >= '0' && **p <= '9') {
        v = v * 10 + (unsigned long)(**p - '0');
        (*p)++;
    }
    return v;
}

__attribute__((constructor)) static void portmap_init(void) {
    const char *s = getenv("REDQUORUM_PORT_MAP");
    if (!s) {
        return;
    }
    while (*s && map_len < MAX_PORTS) {
        unsigned long from = parse_port(&s);
        if (*s != ':') {
            return;
        }
        s++;
        unsigned long to = parse_port(&s);
        if (from == 0 || from > 65535 || to == 0 || to > 65535) {
            return;
        }
        map_from[map_len] = (unsigned short)from;
        map_to[map_len] = (unsigned short)to;
        map_len++;
        if (*s != ',') {
            return;
        }
        s++;
    }
}

int connect(int fd, const struct sockaddr *addr, socklen_t len) {
    if (addr && addr->sa_family == AF_INET && len >= (socklen_t)sizeof(struct sockaddr_in)) {
        const struct sockaddr_in *in = (const struct sockaddr_in *)addr;
        if (in->sin_addr.s_addr == htonl(INADDR_LOOPBACK)) {
            unsigned short port = ntohs(in->sin_port);
            for (int i = 0; i < map_len; i++) {
                if (map_from[i] == port) {
                    struct sockaddr_in copy;
                    memcpy(&copy, in, sizeof copy);
                    copy.sin_port = htons(map_to[i]);
                    return (int)syscall(SYS_connect, fd, (const struct sockaddr *)&copy,
                                        (socklen_t)sizeof copy);
                }
            }
        }
    }
    return (int)syscall(SYS_connect, fd, addr, len);
}
