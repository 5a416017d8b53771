/*
 * rmq_layout.h - the on-disk layout the C core reads, and its constants.
 *
 * ON-DISK LAYOUT READ HERE (all integers big-endian, signed two's complement;
 * section numbers refer to docs/rocketmq-store-format.md)
 *
 * Mapped files (§2.1): every file of a queue is named by the address of its first byte and all
 * files of a queue have the same size; the CommitLog address of byte p of file F is start(F) + p.
 *
 * CommitLog record (§3.2). bh = 8, or 20 when SYSFLAG & 0x10 (born host IPv6);
 * sh = 8, or 20 when SYSFLAG & 0x20 (store host IPv6); tl = 1 for V1, 2 for V2.
 *     off         size  field
 *     0           4     TOTALSIZE   whole record length
 *     4           4     MAGIC       0xDAA320A7 (V1) | 0xDAA320AB (V2, 5.x topics > 127 chars)
 *     8           4     BODYCRC     crc32(stored body) & 0x7FFFFFFF
 *     12          4     QUEUEID
 *     16          4     FLAG
 *     20          8     QUEUEOFFSET
 *     28          8     PHYSICALOFFSET
 *     36          4     SYSFLAG     0x1 compressed, 0x700 compression type, 0x10/0x20 IPv6 hosts
 *     40          8     BORNTIMESTAMP (ms)
 *     48          bh    BORNHOST    4|16 address bytes + int32 port
 *     48+bh       8     STORETIMESTAMP (ms)
 *     56+bh       sh    STOREHOST
 *     56+bh+sh    4     RECONSUMETIMES
 *     60+bh+sh    8     PREPARED TRANSACTION OFFSET
 *     68+bh+sh    4     BODYLENGTH
 *     72+bh+sh    body  BODY (as stored, possibly compressed)
 *     ...         tl    TOPICLENGTH (int8 in V1, int16 in V2), then TOPIC (UTF-8)
 *     ...         2     PROPERTIESLENGTH (int16), then PROPERTIES (UTF-8)
 *   Length rule: TOTALSIZE = 74 + bh + sh + tl + bodyLen + topicLen + propLen. The broker never
 *   writes negative lengths, so a negative one is reported as corruption (NEGATIVE_LENGTH).
 *   Properties (§4.1): entries "name 0x01 value" separated by 0x02 (5.x also after the last one);
 *   an entry counts only with a non-empty name and value; a later duplicate replaces the value.
 *
 * BLANK record (§3.4): int32 TOTALSIZE = bytes to end of file, int32 MAGIC 0xCBD43194. It ends
 *   the file; the next record is at position 0 of the next file. Records never span files.
 *
 * ConsumeQueue unit (§7.1), 20 bytes, unit n at byte n*20 of the queue's address space:
 *     0 int64 CommitLog physical offset, 8 int32 record size (== TOTALSIZE),
 *     12 int64 tagsCode (Java String.hashCode of TAGS, sign-extended; 0 when untagged).
 *   Valid iff phy >= 0 && size > 0 (§2.4). Pre-blank filler units (0, 0x7FFFFFFF, 0) are
 *   skipped where the broker writes them, as the leading run of the queue's first file (§7.4:
 *   ConsumeQueue.fillPreBlank); one anywhere else (after a written unit) is BAD_UNIT.
 *   The record a unit points to must be that unit's message (else UNIT_MISMATCH): PHYSICALOFFSET
 *   equal to the unit's physical offset, always; and when the scan knows its queue (check_queue),
 *   TOPIC, QUEUEID and QUEUEOFFSET equal to the queue's topic, id and the unit's queue offset
 *   (§7.1, Appendix A.3 step 5), or, for light message queues and other multi-dispatch queues
 *   whose units point at the parent topic's records (§14 item 18), the queue's topic listed in
 *   the INNER_MULTI_DISPATCH property with the unit's queue offset at the same index of
 *   INNER_MULTI_QUEUE_OFFSET (§4.2, both comma-separated) and QUEUEID equal to the queue id or
 *   the queue id 0.
 *
 * DLedger entry (DLedger 0.3.x DLedgerEntryCoder; brokers with enableDLegerCommitLog, 4.5+):
 *   the CommitLog address space is that of the DLedger data files (dledger-<selfId>/data/), and
 *   every record sits in an entry of a 48-byte header (all big-endian):
 *     0 int32 MAGIC 1, 4 int32 SIZE (header + body), 8 int64 INDEX, 16 int64 TERM,
 *     24 int64 POS (the entry's own address), 32 int32 CHANNEL, 36 int32 CHAIN CRC,
 *     40 int32 BODY CRC (both CRCs are written as 0 by DLedger 0.3.x: nothing to check),
 *     44 int32 BODY LENGTH; then the body: one CommitLog record whose PHYSICALOFFSET is POS + 48.
 *   A ConsumeQueue unit points at the record (POS + 48). A record at or above the DLedger start
 *   (rmq_files.dledger_from) must sit in such an entry: MAGIC 1, POS = record - 48, BODY LENGTH
 *   = TOTALSIZE and SIZE = TOTALSIZE + 48, else BAD_ENTRY. Entries never span files; a file
 *   ends with int32 -1 (BLANK) where the next entry did not fit.
 *
 * Safety: every read is bounds-checked against the mapping; a bad record yields an error code and
 * a message naming the file, the byte position and the physical/queue offset, never a crash and
 * never a silent skip. Files are mapped PROT_READ/MAP_SHARED; the mapping must not be truncated
 * underneath us (the broker never shrinks a file; it only deletes whole files, which is harmless
 * for an existing mapping). Built with -DRMQ_HEAP_SEGMENTS (the sanitizer build) files are read
 * into exact-size heap buffers instead, so AddressSanitizer checks every read against file ends.
 *
 * Output: rmq_scan_queue fills an rmq_batch of 64-byte aligned Arrow buffers (see rmq_core.h);
 * rmq_batch_export hands them to Arrow through the C Data Interface (one struct array, zero
 * copy; its release callback frees the batch). Large freed buffers are pooled for the next scan.
 *
 * Speed (bench/bench_core.py; the decode is bound by memory traffic, then by instructions):
 *  - a record's structural checks are done once, branch-light (parse_fast); only a record that
 *    fails them goes through parse_record, which finds the exact error;
 *  - properties: a row with the same property names in the same order as the last row (its
 *    "shape", props_tpl), and usually the same layout, is matched rather than parsed; other rows
 *    are split in one SIMD pass that also tells whether they are ASCII (non-ASCII text gets the
 *    full UTF-8 validator); map entries are appended as they are found;
 *  - output: buffers are sized ahead (from the ConsumeQueue unit sizes that the records they
 *    point to confirm - a unit's size alone never sizes a buffer, see unit_bytes_checked - then
 *    from the first row), so a row does one capacity check for its body and one for all short
 *    strings; the row-indexed columns are staged 16 rows at a time and written as whole cache
 *    lines, and in a
 *    big batch the body column and those lines go out with streaming stores (no read of the
 *    destination lines first); the short-string buffers are prefetched for writing;
 *  - the CommitLog record of a unit is prefetched a few units ahead;
 *  - tag-filtered scans first collect the units whose tag hash matches (a branch-light loop over
 *    the 20-byte units), then decode the matches with their records prefetched.
 */
#ifndef RMQ_LAYOUT_H
#define RMQ_LAYOUT_H

#define MAGIC_V1 0xDAA320A7u
#define MAGIC_V2 0xDAA320ABu
#define MAGIC_BLANK 0xCBD43194u
#define CQ_UNIT 20
#define DLEDGER_HEADER 48  /* DLedgerEntry.BODY_OFFSET */
#define DLEDGER_MAGIC 1
#define PREBLANK_SIZE 0x7FFFFFFF

#endif
