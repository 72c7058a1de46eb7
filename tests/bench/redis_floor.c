// The floor of a Redis lock wrapper, for the benchmark to measure beside
// lockrun: connect, SET NAME owner NX PX 30000, fork and exec the job, wait,
// and delete with a compare-and-delete EVAL. No renewal, no guard, no
// waiting, no error handling worth the name: what any wrapper must at least
// pay on this machine.
//
//     redis_floor PORT NAME JOB [ARG...]
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/wait.h>
static int rq(int fd, const char *cmd, char *buf, int n) {
  if (write(fd, cmd, strlen(cmd)) < 0) return -1;
  int r = read(fd, buf, n - 1); if (r > 0) buf[r] = 0; return r;
}
int main(int argc, char **argv) {
  if (argc < 4) return 64;
  int fd = socket(AF_INET, SOCK_STREAM, 0); int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(atoi(argv[1]))};
  inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  if (connect(fd, (struct sockaddr *)&a, sizeof a)) return 69;
  char cmd[512], buf[256];
  snprintf(cmd, sizeof cmd, "*6\r\n$3\r\nSET\r\n$%zu\r\n%s\r\n$5\r\nowner\r\n$2\r\nNX\r\n$2\r\nPX\r\n$5\r\n30000\r\n", strlen(argv[2]), argv[2]);
  if (rq(fd, cmd, buf, sizeof buf) <= 0 || buf[0] != '+') return 75;
  pid_t p = fork();
  if (p == 0) { execvp(argv[3], argv + 3); _exit(127); }
  int st; waitpid(p, &st, 0);
  const char *lua = "if redis.call('get',KEYS[1])==ARGV[1] then return redis.call('del',KEYS[1]) else return 0 end";
  snprintf(cmd, sizeof cmd, "*5\r\n$4\r\nEVAL\r\n$%zu\r\n%s\r\n$1\r\n1\r\n$%zu\r\n%s\r\n$5\r\nowner\r\n", strlen(lua), lua, strlen(argv[2]), argv[2]);
  rq(fd, cmd, buf, sizeof buf);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 70;
}
