// The object collectives' encoding (src/comm/objects/plain_data.cpp): values come
// back as they were sent, typed containers included; what is not plain
// data is refused when sent; bytes that are not an encoding (cut short,
// foreign, too deep, sizes that do not add up) are a DataError when
// received, never a crash or an allocation beyond the bytes.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include "comm/objects/plain_data.h"
#include "ddp/errors.h"

namespace {

using ddp::detail::decode_plain_data;
using ddp::detail::encode_plain_data;

c10::IValue round_trip(const c10::IValue& v) { return decode_plain_data(encode_plain_data(v, "test: "), "test: "); }

c10::IValue sample() {
  c10::impl::GenericDict d(c10::StringType::get(), c10::AnyType::get());
  d.insert("int", int64_t{-7});
  d.insert("double", 0.1);
  d.insert("bool", true);
  d.insert("none", c10::IValue());
  d.insert("bytes", std::string("a\0b\xff", 4));
  d.insert("complex", c10::complex<double>(1.5, -2));
  d.insert("ints", c10::List<int64_t>({1, 2, 3}));
  d.insert("tuple", c10::ivalue::Tuple::create({int64_t{1}, std::string("x")}));
  d.insert("tensor", torch::arange(6, torch::kFloat).reshape({2, 3}).t());  // not contiguous
  d.insert("half", torch::ones({2}, torch::kHalf).requires_grad_(true));
  c10::impl::GenericDict by_int(c10::IntType::get(), c10::StringType::get());
  by_int.insert(int64_t{3}, std::string("three"));
  d.insert("by_int", by_int);
  return d;
}

TEST(PlainData, ValuesComeBackAsSent) {
  const auto v = sample();
  const auto back = round_trip(v).toGenericDict();
  const auto orig = v.toGenericDict();
  ASSERT_EQ(back.size(), orig.size());
  EXPECT_EQ(back.at("int").toInt(), -7);
  EXPECT_EQ(back.at("double").toDouble(), 0.1);
  EXPECT_TRUE(back.at("bool").toBool());
  EXPECT_TRUE(back.at("none").isNone());
  EXPECT_EQ(back.at("bytes").toStringRef(), std::string("a\0b\xff", 4));
  EXPECT_EQ(back.at("complex").toComplexDouble(), c10::complex<double>(1.5, -2));
  EXPECT_EQ(back.at("ints").toIntVector(), (std::vector<int64_t>{1, 2, 3}));  // still a List[int]
  EXPECT_EQ(back.at("tuple").toTupleRef().elements()[1].toStringRef(), "x");
  EXPECT_TRUE(back.at("tensor").toTensor().equal(orig.at("tensor").toTensor()));
  EXPECT_EQ(back.at("half").toTensor().scalar_type(), torch::kHalf);
  EXPECT_TRUE(back.at("half").toTensor().requires_grad());
  EXPECT_EQ(back.at("by_int").toGenericDict().at(int64_t{3}).toStringRef(), "three");
  std::vector<std::string> keys;  // in the order they were inserted
  for (const auto& e : back) keys.push_back(e.key().toStringRef());
  EXPECT_EQ(keys.front(), "int");
  EXPECT_EQ(keys.back(), "by_int");
}

TEST(PlainData, WhatIsNotPlainDataIsRefusedWhenSentNamingWhere) {
  c10::impl::GenericList list(c10::AnyType::get());
  list.push_back(int64_t{1});
  list.push_back(c10::make_intrusive<c10::ivalue::Future>(c10::AnyType::get()));
  try {
    encode_plain_data(list, "rank 0: ");
    FAIL() << "a Future was encoded";
  } catch (const ddp::UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("the object[1]: a Future is not plain data"), std::string::npos) << e.what();
  }
  EXPECT_THROW(encode_plain_data(torch::ones({2}).to_sparse(), "rank 0: "), ddp::UsageError);
  c10::impl::GenericList itself(c10::AnyType::get());  // a list that holds itself: refused, not a stack overflow
  itself.push_back(int64_t{1});
  itself.push_back(itself);
  EXPECT_THROW(encode_plain_data(itself, "rank 0: "), ddp::UsageError);
  itself.set(1, c10::IValue());  // the cycle broken: nothing leaks
}

TEST(PlainData, TensorViewsAndUndefinedTensorsComeBackAsValues) {
  auto z = torch::tensor({c10::complex<float>(1, 2), c10::complex<float>(3, -4)});
  EXPECT_TRUE(round_trip(z.conj()).toTensor().equal(z.conj().resolve_conj()));  // the conjugate's values
  EXPECT_TRUE(round_trip(-torch::arange(3.0)).toTensor().equal(-torch::arange(3.0)));
  c10::List<at::Tensor> tensors;
  tensors.push_back(torch::ones({1}));
  tensors.push_back(at::Tensor());
  const auto back = round_trip(tensors).toTensorList();
  ASSERT_EQ(back.size(), 2u);
  EXPECT_FALSE(back.get(1).defined());
}

TEST(PlainData, EveryCutOfAnEncodingIsADataError) {
  const std::string bytes = encode_plain_data(sample(), "test: ");
  for (size_t n = 0; n < bytes.size(); ++n)
    EXPECT_THROW(decode_plain_data(bytes.substr(0, n), "test: "), ddp::DataError) << n;
  EXPECT_THROW(decode_plain_data(bytes + "x", "test: "), ddp::DataError);
  std::string other = bytes;
  other[0] = 'X';
  EXPECT_THROW(decode_plain_data(other, "test: "), ddp::DataError);
}

TEST(PlainData, HostileBytesAreBoundedByWhatTheyHold) {
  const std::string magic("DDPV\x01", 5);
  auto u64 = [](uint64_t v) { return std::string(reinterpret_cast<const char*>(&v), 8); };
  // A list claiming 2^60 entries, a string of 2^40 bytes: refused before allocating.
  EXPECT_THROW(decode_plain_data(magic + "L" + std::string(1, '\0') + u64(1ull << 60), "t: "), ddp::DataError);
  EXPECT_THROW(decode_plain_data(magic + "S" + u64(1ull << 40) + "abc", "t: "), ddp::DataError);
  // A tensor whose sizes multiply past int64, or whose byte count lies.
  std::string huge = magic + "X" + std::string(1, '\x06') + std::string(1, '\0') + std::string("\xff\xff", 2) +
                     std::string(1, '\0') + std::string(1, '\x02') + u64(1ull << 40) + u64(1ull << 40) + u64(0);
  EXPECT_THROW(decode_plain_data(huge, "t: "), ddp::DataError);
  // No elements, but sizes whose strides would overflow.
  std::string empty_huge = magic + "X" + std::string(1, '\x06') + std::string(1, '\0') + std::string("\xff\xff", 2) +
                           std::string(1, '\0') + std::string(1, '\x03') + u64(0) + u64(1ull << 62) +
                           u64(1ull << 62) + u64(0);
  EXPECT_THROW(decode_plain_data(empty_huge, "t: "), ddp::DataError);
  // Nesting past the bound: a tuple of a tuple of ... (each one byte and a count).
  std::string deep = magic;
  for (int i = 0; i < 600; ++i) deep += "U" + u64(1);
  deep += "N";
  try {
    decode_plain_data(deep, "rank 1: ");
    FAIL() << "600 levels were decoded";
  } catch (const ddp::DataError& e) {
    EXPECT_NE(std::string(e.what()).find("nesting deeper than 512"), std::string::npos) << e.what();
  }
}

}  // namespace
