#!/usr/bin/perl
# link-sockets.pl [--rmem BYTES] FD:ADDR:PORT:PEER_PORT... -- CMD [ARGS...]
#
# Opens one UDP socket per FD:ADDR:PORT:PEER_PORT, bound to ADDR:PORT and
# connected to ADDR:PEER_PORT, puts it on file descriptor FD (3 or more)
# and execs CMD with those descriptors open: vm-run.sh's QEMU takes them
# as `-netdev dgram,local.type=fd,local.str=FD`, and sends with send(2),
# hence connected.
#
# --rmem BYTES (0: the host's default) is each socket's receive buffer, as
# SO_RCVBUF and `ss -m` (rb) report it. Set on the socket itself, so that
# nothing host-wide changes: SO_RCVBUFFORCE (CAP_NET_ADMIN), else
# SO_RCVBUF, which net.core.rmem_max caps (a warning then says so).
#
# Only perl-base's modules: every Debian has them.
use strict;
use warnings;
use Socket qw(AF_INET SOCK_DGRAM IPPROTO_UDP SOL_SOCKET SO_RCVBUF SO_RCVBUFFORCE
              inet_aton pack_sockaddr_in);
use POSIX ();
use Fcntl qw(F_GETFD F_SETFD FD_CLOEXEC);

my $me = 'link-sockets.pl';
sub usage { die "usage: $me [--rmem BYTES] FD:ADDR:PORT:PEER_PORT... -- CMD [ARGS...]\n"; }

my $rmem = 0;
my @specs;
while (@ARGV) {
    my $a = shift @ARGV;
    if ($a eq '--') { last; }
    if ($a eq '--rmem') {
        $rmem = shift @ARGV // usage();
        $rmem =~ /^[0-9]+$/ or die "$me: --rmem takes a number of bytes, not '$rmem'\n";
        next;
    }
    $a =~ /^([0-9]+):([0-9.]+):([0-9]+):([0-9]+)$/
        or die "$me: '$a' is not FD:ADDR:PORT:PEER_PORT\n";
    my ($fd, $addr, $port, $peer) = ($1, $2, $3, $4);
    $fd >= 3 or die "$me: $a: FD must be 3 or more (0-2 are CMD's standard streams)\n";
    $port <= 65535 && $peer <= 65535 or die "$me: $a: a UDP port is at most 65535\n";
    defined inet_aton($addr) or die "$me: $a: '$addr' is not an IPv4 address\n";
    push @specs, [$fd, $addr, $port, $peer, $a];
}
@ARGV or usage();
my %seen;
$seen{$_->[0]}++ and die "$me: FD $_->[0] given twice\n" for @specs;

my $short = 0;
for my $s (@specs) {
    my ($fd, $addr, $port, $peer, $spec) = @$s;
    socket(my $sock, AF_INET, SOCK_DGRAM, IPPROTO_UDP) or die "$me: $spec: socket: $!\n";
    if ($rmem > 0) {
        # Linux doubles the figure asked for (room for its bookkeeping) and
        # reports the doubled one: ask for half.
        my $ask = pack('i', int(($rmem + 1) / 2));
        setsockopt($sock, SOL_SOCKET, SO_RCVBUFFORCE, $ask)
            or ($!{EPERM} and setsockopt($sock, SOL_SOCKET, SO_RCVBUF, $ask))
            or die "$me: $spec: setting the receive buffer to $rmem bytes: $!\n";
        my $got = unpack('i', getsockopt($sock, SOL_SOCKET, SO_RCVBUF));
        $short = $got if $got < $rmem && (!$short || $got < $short);
    }
    # No SO_REUSEADDR: a port another socket holds fails here, rather than
    # two VMs sharing it and crossing their links.
    bind($sock, pack_sockaddr_in($port, inet_aton($addr)))
        or die "$me: $spec: cannot bind UDP $addr:$port: $! (see ss -uanp 'sport = :$port'; another VM pair?)\n";
    connect($sock, pack_sockaddr_in($peer, inet_aton($addr)))
        or die "$me: $spec: cannot connect to UDP $addr:$peer: $!\n";
    # dup2 leaves the new descriptor open across exec (perl marks its own
    # close-on-exec).
    if (fileno($sock) != $fd) {
        defined POSIX::dup2(fileno($sock), $fd) or die "$me: $spec: dup2 to fd $fd: $!\n";
        close($sock);
    } else {
        my $flags = fcntl($sock, F_GETFD, 0) or die "$me: $spec: F_GETFD: $!\n";
        fcntl($sock, F_SETFD, $flags & ~FD_CLOEXEC) or die "$me: $spec: F_SETFD: $!\n";
        # Keep the handle (and so the descriptor) alive until exec.
        push @$s, $sock;
    }
}
warn "$me: WARNING: link receive buffers are $short bytes, not $rmem: without CAP_NET_ADMIN, net.core.rmem_max caps them (run as root, or LINK_RMEM=0 for the host's default)\n"
    if $short;

exec { $ARGV[0] } @ARGV or die "$me: cannot run $ARGV[0]: $!\n";
