// Filesystem helpers: whole-file reads and crash-safe replacement.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>

namespace msaflow {

// Reads the whole file. Throws kNotFound if it does not exist, kIo on other failures.
std::string ReadFile(const std::string& path);

// A file a user names as input (a pipeline, a machine file, an ONNX model): the same, but only a
// regular file of at most `max_bytes`. A device (/dev/zero), a FIFO or a directory is refused
// with kInvalidInput naming the path and `what` was expected, before any byte is read and
// without blocking on the FIFO's writer; so is a file over the bound.
std::string ReadInputFile(const std::string& path, const std::string& what, uint64_t max_bytes);

// Writes `data` to a temporary file beside `path`, fsyncs it, renames it over `path` and fsyncs
// the directory: a reader sees the old file or the new one, never a mix. Creates parent
// directories. Throws kIo.
void WriteFileAtomic(const std::string& path, std::string_view data);
// The same, for a file made of several pieces (no copy into one buffer).
void WriteFileAtomic(const std::string& path, std::initializer_list<std::string_view> parts);

// The temporary files WriteFileAtomic leaves behind when a process dies mid-write are named
// "<path>.tmp.<pid>.<n>"; this says whether a file name is one.
bool IsAtomicWriteLeftover(const std::string& file_name);

// Appends one line and fsyncs (journals). Throws kIo.
void AppendLineSynced(const std::string& path, std::string_view line);

bool PathExists(const std::string& path);

// This boot's id (/proc/sys/kernel/random/boot_id): two processes that read the same one run
// on the same node. "" if unreadable.
std::string ReadBootId();
void MakeDirs(const std::string& path);

}  // namespace msaflow
