// Crafted PyTorch files for the hostile-input tests: a small zip writer
// (stored entries as PyTorch writes them, deflated ones as LibTorch writes
// code, any field wrong on purpose) and a pickle builder with the opcodes
// torch.save uses. No Python needed.
#pragma once

#include <zlib.h>

#include <cstdint>
#include <string>
#include <vector>

namespace ddp::crafted {

// ---- a zip writer: stored entries, as PyTorch writes them -----------------

inline void put(std::string& out, uint64_t v, int bytes) {
  for (int k = 0; k < bytes; ++k) out.push_back(static_cast<char>((v >> (8 * k)) & 0xff));
}

struct Entry {
  std::string name, data;
  bool wrong_crc = false;
  bool deflate = false;        // method 8, as LibTorch writes code files
  uint64_t claimed_size = 0;   // deflated: the uncompressed size the directory says (0: the real one)
};

// Raw deflate (no zlib header), as zip holds it.
inline std::string deflated(const std::string& data) {
  z_stream z{};
  deflateInit2(&z, 9, Z_DEFLATED, -MAX_WBITS, 9, Z_DEFAULT_STRATEGY);
  std::string out(deflateBound(&z, data.size()), '\0');
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(data.data()));
  z.avail_in = static_cast<uInt>(data.size());
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = static_cast<uInt>(out.size());
  deflate(&z, Z_FINISH);
  out.resize(z.total_out);
  deflateEnd(&z);
  return out;
}

struct Zip {
  std::string bytes;
  std::vector<size_t> local_offsets;  // of each entry's local header
  size_t central_offset = 0, eocd_offset = 0;
};

inline Zip make_zip(const std::vector<Entry>& entries) {
  Zip z;
  std::string central;
  for (const auto& e : entries) {
    uint32_t crc = static_cast<uint32_t>(::crc32(0, reinterpret_cast<const Bytef*>(e.data.data()),
                                                 static_cast<uInt>(e.data.size())));
    if (e.wrong_crc) crc ^= 1;
    const std::string body = e.deflate ? deflated(e.data) : e.data;
    const uint64_t usize = e.claimed_size ? e.claimed_size : e.data.size();
    const int method = e.deflate ? 8 : 0;
    const size_t offset = z.bytes.size();
    z.local_offsets.push_back(offset);
    put(z.bytes, 0x04034b50, 4);
    put(z.bytes, 20, 2);  // version needed
    put(z.bytes, 0, 2);   // flags
    put(z.bytes, method, 2);
    put(z.bytes, 0, 4);   // time, date
    put(z.bytes, crc, 4);
    put(z.bytes, body.size(), 4);
    put(z.bytes, usize, 4);
    put(z.bytes, e.name.size(), 2);
    put(z.bytes, 0, 2);
    z.bytes += e.name + body;

    put(central, 0x02014b50, 4);
    put(central, 20, 2);
    put(central, 20, 2);
    put(central, 0, 2);
    put(central, method, 2);
    put(central, 0, 4);
    put(central, crc, 4);
    put(central, body.size(), 4);
    put(central, usize, 4);
    put(central, e.name.size(), 2);
    put(central, 0, 2);  // extra
    put(central, 0, 2);  // comment
    put(central, 0, 2);  // disk
    put(central, 0, 2);  // internal attributes
    put(central, 0, 4);  // external attributes
    put(central, offset, 4);
    central += e.name;
  }
  z.central_offset = z.bytes.size();
  z.bytes += central;
  z.eocd_offset = z.bytes.size();
  put(z.bytes, 0x06054b50, 4);
  put(z.bytes, 0, 4);  // disks
  put(z.bytes, entries.size(), 2);
  put(z.bytes, entries.size(), 2);
  put(z.bytes, central.size(), 4);
  put(z.bytes, z.central_offset, 4);
  put(z.bytes, 0, 2);
  return z;
}

// ---- a pickle builder (protocol 2, the opcodes torch.save uses) -----------

inline std::string str(const std::string& s) {
  std::string out = "X";
  put(out, s.size(), 4);
  return out + s;
}
inline std::string i64(int64_t v) {
  std::string out = "\x8a\x08";
  put(out, static_cast<uint64_t>(v), 8);
  return out;
}
inline std::string global(const std::string& module, const std::string& name) { return "c" + module + "\n" + name + "\n"; }
inline std::string tuple(const std::vector<int64_t>& xs) {
  std::string out = "(";
  for (auto x : xs) out += i64(x);
  return out + "t";
}

struct TensorSpec {
  std::string key = "0";
  std::string storage = "FloatStorage";
  int64_t offset = 0;
  std::vector<int64_t> sizes{2, 3}, strides{3, 1};
};

inline std::string tensor_pkl(const TensorSpec& t) {
  return global("torch._utils", "_rebuild_tensor_v2") + "((" + str("storage") + global("torch", t.storage) + str(t.key) +
         str("cpu") + i64(6) + "tQ" + i64(t.offset) + tuple(t.sizes) + tuple(t.strides) + "\x89" +
         global("collections", "OrderedDict") + ")RtR";
}

// A state dict {"w": tensor} pickled as torch.save writes it.
inline std::string state_dict_pkl(const TensorSpec& t) { return "\x80\x02}(" + str("w") + tensor_pkl(t) + "u."; }

inline std::string floats(std::vector<float> xs) {
  return std::string(reinterpret_cast<const char*>(xs.data()), xs.size() * sizeof(float));
}

inline const std::string kWeights = floats({1, 2, 3, 4, 5, 6});

inline std::vector<Entry> archive(const std::string& pkl, const std::string& storage_bytes = kWeights) {
  return {{"archive/data.pkl", pkl}, {"archive/data/0", storage_bytes}, {"archive/version", "3\n"}};
}

}  // namespace ddp::crafted
