// Read an mcap_foxglove episode the way Foxglove and Lichtblick do: @mcap/core's indexed reader,
// protobufjs with the embedded FileDescriptorSet, @foxglove/rosmsg2-serialization for CDR.
//   cd tools/foxglove_read && npm install && node check.mjs EPISODE.mcap
// Prints each channel's schema, message count and first message; exits 1 when a channel has no
// decoder or the frame channels hold different message counts.
import { McapIndexedReader } from "@mcap/core";
import { parse } from "@foxglove/rosmsg";
import { MessageReader } from "@foxglove/rosmsg2-serialization";
import protobuf from "protobufjs";
import descriptor from "protobufjs/ext/descriptor/index.js";
import { decompress } from "fzstd";
import lz4 from "lz4js";
import { open } from "node:fs/promises";

const fh = await open(process.argv[2], "r");
const size = BigInt((await fh.stat()).size);
const readable = {
  size: async () => size,
  read: async (offset, length) => {
    const buf = new Uint8Array(Number(length));
    await fh.read(buf, 0, Number(length), Number(offset));
    return buf;
  },
};
const reader = await McapIndexedReader.Initialize({
  readable,
  decompressHandlers: { zstd: (buf) => decompress(buf), lz4: (buf) => new Uint8Array(lz4.decompress(buf)) },
});
const decoders = new Map();
for (const [id, ch] of reader.channelsById) {
  const schema = reader.schemasById.get(ch.schemaId);
  if (ch.messageEncoding === "protobuf") {
    const root = protobuf.Root.fromDescriptor(descriptor.FileDescriptorSet.decode(schema.data));
    const type = root.lookupType(schema.name);
    decoders.set(id, (data) => type.toObject(type.decode(data), { longs: Number }));
  } else if (ch.messageEncoding === "cdr") {
    const r = new MessageReader(parse(new TextDecoder().decode(schema.data), { ros2: true }));
    decoders.set(id, (data) => r.readMessage(data));
  }
}
const out = { profile: reader.header.profile, topics: {}, metadata: [] };
for await (const msg of reader.readMessages()) {
  const ch = reader.channelsById.get(msg.channelId);
  const m = decoders.get(msg.channelId)(msg.data);
  const t = (out.topics[ch.topic] ??= { schema: reader.schemasById.get(ch.schemaId).name, count: 0 });
  t.count += 1;
  if (t.count === 1) {
    if (m.format !== undefined) {  // foxglove.CompressedVideo / CompressedImage
      t.first = { frame_id: m.frame_id, format: m.format, bytes: m.data.length, stamp_s: m.timestamp?.seconds ?? 0 };
    } else if (m.position !== undefined) {  // sensor_msgs/msg/JointState
      t.first = { name: m.name, position: Array.from(m.position) };
    } else {  // std_msgs/msg/String: the episode's review
      t.first = { text: m.data.split("\n").slice(0, 4) };
    }
  }
}
for await (const rec of reader.readMetadata()) out.metadata.push(rec.name);
console.log(JSON.stringify(out, null, 1));
const counts = new Set(Object.entries(out.topics).filter(([k]) => k !== "/eva_export/episode").map(([, t]) => t.count));
if (decoders.size !== reader.channelsById.size || counts.size !== 1) {
  console.error(`channels without a decoder or with different counts: ${[...counts]}`);
  process.exit(1);
}
