// dfp: the checkpoint file's container, under the trainer's checkpoints and the public
// save_state/load_state (state.hpp); the format and its versions: docs/design/checkpoint-format.md.
//
// Layout: "DFPCKPT1", then records [u32 name length][name][u64 float count][floats] (host byte
// order), the first record being "meta" (its floats encode the meta text's bytes one per float:
// lines "key=value"; files of older versions hold a byte above 127 as -128..-1), and finally a u32 CRC-32 of everything before it.
#pragma once

#include <cstddef>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace dfp {

inline constexpr char kCheckpointMagic[8] = {'D', 'F', 'P', 'C', 'K', 'P', 'T', '1'};

struct Checkpoint {
  std::map<std::string, std::string> meta;  // keys without '=' or newline; values without newline
  std::map<std::string, std::vector<float>> tensors;
  // Tensors written as `tensors` are, read where they live (a model's weights and statistics, an
  // optimizer's momenta): a checkpoint of them adds no copy to the process's peak. They must stay
  // alive and unchanged until the checkpoint is written. A name is in one of the two maps, not
  // both; parse_checkpoint fills `tensors` only.
  std::map<std::string, std::span<const float>> borrowed;
};

// The file's bytes for ck, in order, to `sink` (pieces of any size; the CRC is computed as they
// go, so no copy of the whole file is made). The records of `tensors` and `borrowed` go in one
// order of names; a name in both is Error(invalid_argument).
void checkpoint_bytes(const Checkpoint& ck, const std::function<void(const void*, size_t)>& sink);
// The same as one string.
std::string checkpoint_bytes(const Checkpoint& ck);

// Writes ck to `path` so that `path` holds the old checkpoint or the new one whatever happens: the
// bytes go to a temporary file of a name no other writer uses (path.<pid>-<clock>.tmp, created exclusively), reach
// the disk, and are renamed over `path`. Any failure (disk full, `path` a directory) removes the
// temporary file and throws Error(io_error) naming the file and what failed.
void write_checkpoint(const std::string& path, const Checkpoint& ck);

// The same for any file's bytes; `what` ("checkpoint", "torch state_dict") names it in errors.
void write_file_atomically(const std::string& path, std::string_view bytes, const std::string& what);
// The same with the bytes written by `fill` through its argument (pieces in order); fill returns
// "" or what failed.
using FileFill = std::function<std::string(const std::function<std::string(const void*, size_t)>& write)>;
void write_file_atomically(const std::string& path, const FileFill& fill, const std::string& what);

// Removes the temporary files that write_file_atomically's writers of `path` (a checkpoint,
// run.toml) killed before their rename left behind. Only for the owner of the directory (a run
// holding its lock): another writer's file would go too.
void remove_write_temporaries(const std::string& path);

// Parses a checkpoint's bytes; `path` names it in messages. A file that ends early is
// Error(corrupt_data) "truncated" naming the record it ends in; a wrong CRC, a meta record that does
// not hold bytes, or a meta line without '=' is Error(corrupt_data) too.
Checkpoint parse_checkpoint(std::string_view bytes, const std::string& path);
// Reads and parses the file. Anything but a regular file (a directory, a device, a FIFO) is
// Error(io_error) before a byte is read, and so is an unreadable file; a file that does not start
// with the magic is refused after its first 8 bytes; then exactly the file's size is read.
Checkpoint read_checkpoint(const std::string& path);

// A list of names as one meta value: comma-separated, with '%', ',', CR and LF written as %25,
// %2C, %0D, %0A; and back (a malformed escape is Error(corrupt_data) naming `what`).
std::string join_names(const std::vector<std::string>& names);
std::vector<std::string> split_names(const std::string& value, const std::string& what);

}  // namespace dfp
