/* native/core/cqpoll.c - part of the C core's one translation unit (see rmq_core.c).
 * Polling many queues of one topic in one call, for planning at thousands of queues: whether each
 * queue folder <topic_dir>/<queue id> is still the one the caller listed (same device, inode and
 * mtime, a real folder), and if so how many valid units the caller's mapping of its live (last)
 * ConsumeQueue file holds now (rmq_cq_valid_units_from: §2.4 units, bounds-checked against the
 * mapping). Files are created, deleted and replaced only by changing their folder, so an
 * unchanged folder means an unchanged list of files; anything else is left to the caller.
 */

int64_t rmq_cq_poll(const char *topic_dir, int64_t n, const int32_t *queue_ids,
                    const int32_t *sel, int64_t nsel, const uint64_t *dev_ino,
                    const int64_t *mtime_ns, rmq_segment *const *live, int64_t *units,
                    int8_t *same) {
    if (!topic_dir || n < 0 || nsel < 0) return -1;
    if (nsel > 0 && (!queue_ids || !sel || !dev_ino || !mtime_ns || !live || !units || !same))
        return -1;
    for (int64_t k = 0; k < nsel; k++) {
        if (sel[k] < 0 || sel[k] >= n) return -1;
        same[sel[k]] = 0;
    }
    int dfd = open(topic_dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (dfd < 0) return -1;
    int64_t kept = 0;
    char name[16];
    for (int64_t k = 0; k < nsel; k++) {
        int32_t i = sel[k];
        if (!live[i]) continue;
        snprintf(name, sizeof name, "%d", (int)queue_ids[i]);
        struct stat st;
        if (fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISDIR(st.st_mode)) continue;
        int64_t mtime;
        if (__builtin_mul_overflow((int64_t)st.st_mtim.tv_sec, (int64_t)1000000000, &mtime)
            || __builtin_add_overflow(mtime, (int64_t)st.st_mtim.tv_nsec, &mtime))
            continue;
        if ((uint64_t)st.st_dev != dev_ino[2 * (int64_t)i]
            || (uint64_t)st.st_ino != dev_ino[2 * (int64_t)i + 1] || mtime != mtime_ns[i])
            continue;
        units[i] = rmq_cq_valid_units_from(live[i], units[i]);
        same[i] = 1;
        kept++;
    }
    close(dfd);
    return kept;
}
