// The node's memory limit that the CPU backend checks its weights and cache against: a cgroup
// tree built in a temporary directory (limits on a parent and on the leaf, "max", a missing
// file, v1's "unlimited" number) gives the smallest number on the path; the whole limit is
// never above the physical memory sysconf reports.
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "test_util.h"

static char root[] = "/tmp/k25-cgroup-XXXXXX";

#define CHECK_EQ_SIZE(got, want)                                                                   \
    do {                                                                                           \
        size_t g_ = (got), w_ = (want);                                                            \
        EXPECT(g_ == w_, "%s = %zu, expected %zu", #got, g_, w_);                                  \
    } while (0)

static void put(const char *dir, const char *text) {
    char path[256];
    snprintf(path, sizeof path, "%s%s", root, dir);
    mkdir(path, 0700);
    if (!text) return;
    snprintf(path, sizeof path, "%s%s/memory.max", root, dir);
    FILE *f = fopen(path, "w");
    CHECK(f != NULL, "cannot create %s", path);
    if (f) fputs(text, f), fclose(f);
}

int main(void) {
    if (!mkdtemp(root)) {
        perror("mkdtemp");
        return 1;
    }
    const size_t G = (size_t)1 << 30;
    put("/job", "4294967296\n");           // the job's --mem: 4 GiB
    put("/job/step", "max\n");             // the step: no limit of its own
    put("/job/step/task", NULL);           // the task's leaf: no file
    put("/other", "1073741824\n");         // a sibling's limit never applies
    put("/v1", "9223372036854771712\n");   // cgroup v1's "unlimited"

    CHECK_EQ_SIZE(k25_cgroup_limit(root, "/job/step/task", "memory.max"), 4 * G);
    CHECK_EQ_SIZE(k25_cgroup_limit(root, "/job/step", "memory.max"), 4 * G);
    CHECK_EQ_SIZE(k25_cgroup_limit(root, "/job", "memory.max"), 4 * G);
    CHECK_EQ_SIZE(k25_cgroup_limit(root, "/", "memory.max"), SIZE_MAX);
    CHECK_EQ_SIZE(k25_cgroup_limit(root, "/missing/leaf", "memory.max"), SIZE_MAX);
    CHECK_EQ_SIZE(k25_cgroup_limit(root, "/v1", "memory.max"), (size_t)9223372036854771712ull);
    put("/job/step/task", "2147483648\n"); // a tighter leaf wins
    CHECK_EQ_SIZE(k25_cgroup_limit(root, "/job/step/task", "memory.max"), 2 * G);

    const char *what = NULL;
    size_t lim = k25_host_mem_limit(&what);
    size_t phys = (size_t)sysconf(_SC_PHYS_PAGES) * (size_t)sysconf(_SC_PAGESIZE);
    CHECK(lim > 0 && lim <= phys, "host limit %zu, physical %zu", lim, phys);
    CHECK(what && (!strcmp(what, "physical memory") == (lim == phys)), "named \"%s\"", what);

    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", root);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", root);
    if (test_failures) return 1;
    printf("test_host_mem: ok (this node: %.2f GiB, %s)\n", lim / (double)G, what);
    return 0;
}
