/* Loaded with LD_PRELOAD into the RocketMQ servers the suite and the benches start: a TCP socket
 * bound to the wildcard address (0.0.0.0 or ::, "every interface") is bound to loopback instead.
 *
 * Why: RocketMQ 4.9's NameServer and brokers, and the fast-remoting and HA ports of 5.x brokers,
 * bind every interface and have no setting to change it (NettyRemotingServer binds
 * new InetSocketAddress(port); HAService the same). Tests must listen on 127.0.0.1 only.
 *
 * An IPv6 socket that also takes IPv4 (IPV6_V6ONLY off, Java's default) is bound to
 * ::ffff:127.0.0.1, so IPv4 clients dialling 127.0.0.1 still reach it; an IPv6-only socket to ::1.
 * Any other address, and every non-TCP socket, is bound as asked. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/socket.h>

typedef int (*bind_fn)(int, const struct sockaddr *, socklen_t);

static int is_tcp(int fd) {
    int type = 0;
    socklen_t len = sizeof type;
    return getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) == 0 && type == SOCK_STREAM;
}

int bind(int fd, const struct sockaddr *addr, socklen_t len) {
    static bind_fn real_bind;
    if (!real_bind) real_bind = (bind_fn)dlsym(RTLD_NEXT, "bind");
    if (addr && addr->sa_family == AF_INET && len >= sizeof(struct sockaddr_in) && is_tcp(fd)) {
        struct sockaddr_in in4;
        memcpy(&in4, addr, sizeof in4);
        if (in4.sin_addr.s_addr == htonl(INADDR_ANY)) {
            in4.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
            return real_bind(fd, (const struct sockaddr *)&in4, sizeof in4);
        }
    } else if (addr && addr->sa_family == AF_INET6 && len >= sizeof(struct sockaddr_in6) && is_tcp(fd)) {
        struct sockaddr_in6 in6;
        memcpy(&in6, addr, sizeof in6);
        if (IN6_IS_ADDR_UNSPECIFIED(&in6.sin6_addr)) {
            int v6only = 0;
            socklen_t optlen = sizeof v6only;
            getsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &v6only, &optlen);
            if (v6only) {
                in6.sin6_addr = in6addr_loopback;
            } else {
                static const unsigned char mapped[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 127, 0, 0, 1};
                memcpy(in6.sin6_addr.s6_addr, mapped, sizeof mapped);
            }
            return real_bind(fd, (const struct sockaddr *)&in6, sizeof in6);
        }
    }
    return real_bind(fd, addr, len);
}
