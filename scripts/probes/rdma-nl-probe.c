/*
 * rdma-nl-probe: answers "which network namespace does RDMA netlink use: the
 * socket's or the calling thread's?", a question that decides how Go code has
 * to call netlink (netlink.NewHandleAt vs. netns.Do / setns on a locked OS
 * thread). Built statically by scripts/vm-smoke.sh and run in the test VM.
 *
 * usage: rdma-nl-probe SOCK_NS THREAD_NS DEV [TARGET_NS]
 *   Opens a NETLINK_RDMA socket while in /run/netns/SOCK_NS, then switches
 *   the thread to /run/netns/THREAD_NS ("-" = stay), lists the rdma devices
 *   the socket sees, and, with TARGET_NS, asks to move DEV to
 *   /run/netns/TARGET_NS. Prints one line per step:
 *     devices: <names...>
 *     set-netns: ok | error <errno name>
 *   Exits 0 when the move succeeded (or was not asked for), 1 otherwise.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/netlink.h>
#include <rdma/rdma_netlink.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static int open_ns(const char *name)
{
	char path[256];
	int fd;

	snprintf(path, sizeof(path), "/run/netns/%s", name);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		fprintf(stderr, "open %s: %s\n", path, strerror(errno));
		exit(2);
	}
	return fd;
}

static void enter_ns(const char *name)
{
	int fd;

	if (strcmp(name, "-") == 0)
		return;
	fd = open_ns(name);
	if (setns(fd, CLONE_NEWNET) < 0) {
		fprintf(stderr, "setns %s: %s\n", name, strerror(errno));
		exit(2);
	}
	close(fd);
}

static void put_attr(struct nlmsghdr *h, unsigned short type, const void *data, unsigned short len)
{
	struct nlattr *a = (struct nlattr *)((char *)h + NLMSG_ALIGN(h->nlmsg_len));

	a->nla_type = type;
	a->nla_len = NLA_HDRLEN + len;
	memcpy((char *)a + NLA_HDRLEN, data, len);
	h->nlmsg_len = NLMSG_ALIGN(h->nlmsg_len) + NLA_ALIGN(a->nla_len);
}

static char buf[65536];

int main(int argc, char **argv)
{
	unsigned int dev_index = 0;
	int found = 0, sk, done = 0;
	struct nlmsghdr *h;
	ssize_t n;

	if (argc < 4) {
		fprintf(stderr, "usage: %s SOCK_NS THREAD_NS DEV [TARGET_NS]\n", argv[0]);
		return 2;
	}
	enter_ns(argv[1]);
	sk = socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_RDMA);
	if (sk < 0) {
		perror("socket");
		return 2;
	}
	enter_ns(argv[2]);

	/* Dump the devices this socket can see. */
	memset(buf, 0, sizeof(buf));
	h = (struct nlmsghdr *)buf;
	h->nlmsg_len = NLMSG_HDRLEN;
	h->nlmsg_type = RDMA_NL_GET_TYPE(RDMA_NL_NLDEV, RDMA_NLDEV_CMD_GET);
	h->nlmsg_flags = NLM_F_REQUEST | NLM_F_DUMP;
	h->nlmsg_seq = 1;
	if (send(sk, buf, h->nlmsg_len, 0) < 0) {
		perror("send");
		return 2;
	}
	printf("devices:");
	while (!done && (n = recv(sk, buf, sizeof(buf), 0)) > 0) {
		for (h = (struct nlmsghdr *)buf; NLMSG_OK(h, n); h = NLMSG_NEXT(h, n)) {
			struct nlattr *a;
			int left;
			unsigned int idx = 0;
			const char *name = NULL;

			if (h->nlmsg_type == NLMSG_DONE || h->nlmsg_type == NLMSG_ERROR) {
				done = 1;
				break;
			}
			left = h->nlmsg_len - NLMSG_HDRLEN;
			for (a = (struct nlattr *)NLMSG_DATA(h); left >= NLA_HDRLEN && a->nla_len >= NLA_HDRLEN;
			     left -= NLA_ALIGN(a->nla_len), a = (struct nlattr *)((char *)a + NLA_ALIGN(a->nla_len))) {
				if (a->nla_type == RDMA_NLDEV_ATTR_DEV_INDEX)
					memcpy(&idx, (char *)a + NLA_HDRLEN, 4);
				if (a->nla_type == RDMA_NLDEV_ATTR_DEV_NAME)
					name = (const char *)a + NLA_HDRLEN;
			}
			if (name) {
				printf(" %s", name);
				if (strcmp(name, argv[3]) == 0) {
					dev_index = idx;
					found = 1;
				}
			}
		}
	}
	printf("\n");
	if (argc < 5)
		return 0;

	/* A device the socket cannot see cannot be named: that is an answer too. */
	if (!found) {
		printf("set-netns: device %s not visible to the socket\n", argv[3]);
		return 1;
	}
	memset(buf, 0, sizeof(buf));
	h = (struct nlmsghdr *)buf;
	h->nlmsg_len = NLMSG_HDRLEN;
	h->nlmsg_type = RDMA_NL_GET_TYPE(RDMA_NL_NLDEV, RDMA_NLDEV_CMD_SET);
	h->nlmsg_flags = NLM_F_REQUEST | NLM_F_ACK;
	h->nlmsg_seq = 2;
	{
		unsigned int fd = (unsigned int)open_ns(argv[4]);

		put_attr(h, RDMA_NLDEV_ATTR_DEV_INDEX, &dev_index, 4);
		put_attr(h, RDMA_NLDEV_NET_NS_FD, &fd, 4);
	}
	if (send(sk, buf, h->nlmsg_len, 0) < 0) {
		perror("send");
		return 2;
	}
	n = recv(sk, buf, sizeof(buf), 0);
	h = (struct nlmsghdr *)buf;
	if (n > 0 && h->nlmsg_type == NLMSG_ERROR) {
		int err = ((struct nlmsgerr *)NLMSG_DATA(h))->error;

		if (err == 0) {
			printf("set-netns: ok\n");
			return 0;
		}
		printf("set-netns: error %s\n", strerrorname_np(-err) ? strerrorname_np(-err) : strerror(-err));
		return 1;
	}
	printf("set-netns: no ack\n");
	return 1;
}
