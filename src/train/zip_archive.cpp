#include "zip_archive.h"

#include <zlib.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <set>

namespace ddp::zip {

namespace {

constexpr uint32_t kLocalSig = 0x04034b50, kCentralSig = 0x02014b50, kEndSig = 0x06054b50;
constexpr uint32_t kZip64EndSig = 0x06064b50, kZip64LocatorSig = 0x07064b50;
constexpr uint64_t kEndSize = 22, kCentralSize = 46, kLocalSize = 30, kZip64EndSize = 56, kLocatorSize = 20;

std::string hex32(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", v);
  return buf;
}

}  // namespace

uint32_t crc32_of(const char* p, uint64_t n) {
  uLong crc = ::crc32(0, Z_NULL, 0);
  while (n > 0) {
    const uInt chunk = static_cast<uInt>(std::min<uint64_t>(n, uint64_t(1) << 30));
    crc = ::crc32(crc, reinterpret_cast<const Bytef*>(p), chunk);
    p += chunk;
    n -= chunk;
  }
  return static_cast<uint32_t>(crc);
}

namespace {

// Little-endian fields of a region already checked to lie inside the file.
uint64_t le(const char* p, int bytes) {
  uint64_t v = 0;
  for (int k = bytes - 1; k >= 0; --k) v = (v << 8) | static_cast<uint8_t>(p[k]);
  return v;
}

// [offset, offset + n) inside [0, limit)?
bool within(uint64_t offset, uint64_t n, uint64_t limit) { return offset <= limit && n <= limit - offset; }

}  // namespace

void Archive::fail(const std::string& why) const {
  throw CheckpointError(what_ + ": not a readable zip archive (" + why + "); is the file truncated or corrupt?");
}

void Archive::read_end_record(uint64_t& count, uint64_t& cd_offset, uint64_t& cd_size, uint64_t& cd_end) const {
  if (size_ < kEndSize) fail("shorter than a zip's end record");
  // The end record sits last, before a comment of up to 64 KiB.
  uint64_t end = size_;  // not found
  const uint64_t lowest = size_ - kEndSize > 0xffff ? size_ - kEndSize - 0xffff : 0;
  for (uint64_t pos = size_ - kEndSize + 1; pos-- > lowest;)
    if (le(data_ + pos, 4) == kEndSig && pos + kEndSize + le(data_ + pos + 20, 2) <= size_) {
      end = pos;
      break;
    }
  if (end == size_) fail("no end of central directory record");
  const char* e = data_ + end;
  if (le(e + 4, 2) != 0 || le(e + 6, 2) != 0 || le(e + 8, 2) != le(e + 10, 2))
    fail("a multi-disk archive, or a damaged end of central directory record");
  count = le(e + 10, 2);
  cd_size = le(e + 12, 4);
  cd_offset = le(e + 16, 4);
  cd_end = end;

  const bool has_locator = end >= kLocatorSize && le(data_ + end - kLocatorSize, 4) == kZip64LocatorSig;
  if (!has_locator) {
    if (count == 0xffff || cd_size == 0xffffffff || cd_offset == 0xffffffff)
      fail("a zip64 archive without its zip64 end record");
    return;
  }
  const char* loc = data_ + end - kLocatorSize;
  const uint64_t z64 = le(loc + 8, 8);
  if (le(loc + 4, 4) != 0 || le(loc + 16, 4) > 1) fail("a multi-disk zip64 archive");
  if (!within(z64, kZip64EndSize, end - kLocatorSize) || le(data_ + z64, 4) != kZip64EndSig)
    fail("the zip64 end of central directory record's offset points outside the file or at something else");
  const char* z = data_ + z64;
  if (le(z + 16, 4) != 0 || le(z + 20, 4) != 0 || le(z + 24, 8) != le(z + 32, 8)) fail("a multi-disk zip64 archive");
  count = le(z + 32, 8);
  cd_size = le(z + 40, 8);
  cd_offset = le(z + 48, 8);
  cd_end = z64;
}

Archive::Archive(const char* data, size_t size, std::string what) : data_(data), size_(size), what_(std::move(what)) {
  uint64_t count = 0, cd_offset = 0, cd_size = 0, cd_end = 0;
  read_end_record(count, cd_offset, cd_size, cd_end);
  if (!within(cd_offset, cd_size, cd_end))
    fail("the central directory (offset " + std::to_string(cd_offset) + ", " + std::to_string(cd_size) +
         " bytes) lies outside the file's " + std::to_string(cd_end) + " bytes before its end record");
  if (count > cd_size / kCentralSize)
    fail("the central directory claims " + std::to_string(count) + " entries in " + std::to_string(cd_size) + " bytes");

  std::set<std::string> names;
  const uint64_t cd_stop = cd_offset + cd_size;
  uint64_t p = cd_offset;
  entries_.reserve(static_cast<size_t>(count));
  for (uint64_t i = 0; i < count; ++i) {
    CentralRecord r = read_central_record(p, i, cd_stop);
    if (!names.insert(r.entry.name).second) fail("two entries named " + r.entry.name);
    entries_.push_back(checked_entry(std::move(r), cd_offset));
  }
  check_inflated_total();
  verified_.assign(entries_.size(), false);
  inflated_.resize(entries_.size());
  if (!entries_.empty()) {
    const auto slash = entries_[0].name.find('/');
    if (slash != std::string::npos) prefix_ = entries_[0].name.substr(0, slash + 1);
  }
}

// The i-th record, at p; p moves past it.
Archive::CentralRecord Archive::read_central_record(uint64_t& p, uint64_t i, uint64_t cd_stop) const {
  const std::string nth = "central directory entry " + std::to_string(i);
  if (!within(p, kCentralSize, cd_stop) || le(data_ + p, 4) != kCentralSig) fail(nth + " is damaged");
  const char* c = data_ + p;
  CentralRecord r;
  r.flags = le(c + 8, 2);
  r.method = le(c + 10, 2);
  const uint64_t name_len = le(c + 28, 2), extra_len = le(c + 30, 2), comment_len = le(c + 32, 2);
  const uint64_t record = kCentralSize + name_len + extra_len + comment_len;
  if (!within(p, record, cd_stop)) fail(nth + "'s name or extra field runs past the central directory");
  Entry& e = r.entry;
  e.name.assign(c + kCentralSize, name_len);
  e.crc32 = static_cast<uint32_t>(le(c + 16, 4));
  r.csize = le(c + 20, 4);
  r.usize = le(c + 24, 4);
  r.local = le(c + 42, 4);
  r.disk = le(c + 34, 2);
  // Zip64: the fields saturated in the fixed part follow in the extra field, in this order.
  for (uint64_t x = 0; x + 4 <= extra_len;) {
    const char* f = c + kCentralSize + name_len + x;
    const uint64_t id = le(f, 2), len = le(f + 2, 2);
    if (x + 4 + len > extra_len) fail("entry " + e.name + "'s extra field is damaged");
    if (id == 0x0001) {
      uint64_t at = 4;
      for (uint64_t* field : {&r.usize, &r.csize, &r.local}) {
        if (*field != 0xffffffff) continue;
        if (at + 8 > 4 + len) fail("entry " + e.name + "'s zip64 field is too short");
        *field = le(f + at, 8);
        at += 8;
      }
    }
    x += 4 + len;
  }
  p += record;
  return r;
}

// The entry, once its method, sizes and local header check out.
Entry Archive::checked_entry(CentralRecord r, uint64_t cd_offset) const {
  Entry e = std::move(r.entry);
  const uint64_t method = r.method, csize = r.csize, usize = r.usize, local = r.local;
  const std::string entry = "entry " + e.name;
  if (r.flags & 0x41) fail(entry + " is encrypted");
  if (r.disk != 0) fail(entry + " is on another disk");
  if (method != 0 && method != 8)
    fail(entry + " is compressed with method " + std::to_string(method) +
         "; PyTorch stores entries uncompressed (LibTorch deflates code), so another tool re-packed the file: load "
         "it in Python and save it again with torch.save");
  if (method == 0 && csize != usize) fail(entry + " is stored but its compressed and uncompressed sizes differ");
  if (method == 8 && usize / 1032 > csize + 1)  // deflate's best ratio is about 1032:1
    fail(entry + " claims to inflate " + std::to_string(csize) + " bytes to " + std::to_string(usize));
  // The local header and the bytes after it come before the central directory.
  if (!within(local, kLocalSize, cd_offset) || le(data_ + local, 4) != kLocalSig)
    fail(entry + "'s local header offset " + std::to_string(local) + " is outside the file or points at no header");
  const char* h = data_ + local;
  const uint64_t local_name = le(h + 26, 2), local_extra = le(h + 28, 2);
  if (!within(local + kLocalSize, local_name, cd_offset) ||
      std::string(h + kLocalSize, local_name) != e.name || le(h + 8, 2) != method)
    fail(entry + "'s local header belongs to another entry or is damaged");
  e.data_offset = local + kLocalSize + local_name + local_extra;
  e.size = usize;
  e.compressed_size = csize;
  e.method = static_cast<uint16_t>(method);
  if (!within(e.data_offset, csize, cd_offset))
    fail(entry + "'s " + std::to_string(csize) + " bytes at offset " + std::to_string(e.data_offset) +
         " run past the end of the data");
  return e;
}

// What inflating may take: PyTorch deflates only small code files, so a
// few times the file (and at least 64 MiB) is plenty; a zip bomb is not.
void Archive::check_inflated_total() const {
  uint64_t inflated = 0;
  const Entry* largest = nullptr;
  for (const auto& e : entries_)
    if (e.method == 8) {
      inflated += e.size;
      if (!largest || e.size > largest->size) largest = &e;
    }
  const uint64_t limit = kInflatedFloor + kInflatedPerByte * static_cast<uint64_t>(size_);
  if (inflated > limit)
    fail("its compressed entries (the largest: " + largest->name + ", " + std::to_string(largest->size) +
         " bytes) would inflate to " + std::to_string(inflated) + " bytes, more than " +
         std::to_string(limit) + " for a file of " + std::to_string(size_) +
         " bytes; PyTorch stores tensor data uncompressed, so this is not a file it wrote");
}

std::string Archive::inflate(const Entry& e) const {
  std::string out(static_cast<size_t>(e.size), '\0');
  z_stream z{};
  if (inflateInit2(&z, -MAX_WBITS) != Z_OK) throw CheckpointError(what_ + ": zlib's inflateInit2 failed");
  const char* in = data_ + e.data_offset;
  uint64_t in_left = e.compressed_size, out_done = 0;
  int rc = Z_OK;
  while (rc == Z_OK) {
    const uInt in_chunk = static_cast<uInt>(std::min<uint64_t>(in_left, 1u << 30));
    const uInt out_chunk = static_cast<uInt>(std::min<uint64_t>(e.size - out_done, 1u << 30));
    z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in));
    z.avail_in = in_chunk;
    z.next_out = reinterpret_cast<Bytef*>(out.data() + out_done);
    z.avail_out = out_chunk;
    rc = ::inflate(&z, Z_NO_FLUSH);
    in += in_chunk - z.avail_in;
    in_left -= in_chunk - z.avail_in;
    out_done += out_chunk - z.avail_out;
    if (rc == Z_OK && in_chunk == z.avail_in && out_chunk == z.avail_out) rc = Z_BUF_ERROR;  // no progress
  }
  inflateEnd(&z);
  if (rc != Z_STREAM_END || out_done != e.size)
    fail("entry " + e.name + "'s deflated data is damaged or does not inflate to the " + std::to_string(e.size) +
         " bytes its directory says");
  return out;
}

const Entry* Archive::find(const std::string& record) const {
  const std::string name = prefix_ + record;
  for (const auto& e : entries_)
    if (e.name == name) return &e;
  return nullptr;
}

std::vector<std::string> Archive::top_level_records() const {
  std::vector<std::string> out;
  for (const auto& e : entries_)
    if (e.name.size() > prefix_.size() && e.name.compare(0, prefix_.size(), prefix_) == 0 &&
        e.name.find('/', prefix_.size()) == std::string::npos)
      out.push_back(e.name.substr(prefix_.size()));
  return out;
}

const char* Archive::bytes(const Entry& e) const {
  const size_t index = static_cast<size_t>(&e - entries_.data());
  if (index >= entries_.size()) throw CheckpointError(what_ + ": internal error: an entry of another archive");
  const char* p = data_ + e.data_offset;
  if (e.method == 8) {
    if (!verified_[index]) inflated_[index] = inflate(e);
    p = inflated_[index].data();
  }
  if (!verified_[index]) {
    const uint32_t actual = crc32_of(p, e.size);
    if (actual != e.crc32)
      throw CheckpointError(what_ + ": entry " + e.name + " is corrupt: its bytes have CRC-32 " + hex32(actual) +
                            " where the zip directory says " + hex32(e.crc32) +
                            ". The file was damaged after it was written (disk, copy or transfer); use another copy "
                            "or the previous checkpoint.");
    verified_[index] = true;
  }
  return p;
}

void Archive::verify_all() const {
  for (const auto& e : entries_) bytes(e);
}

}  // namespace ddp::zip
