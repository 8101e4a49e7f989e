import ArgumentParser

@main
struct PubSubCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "pubsub",
        abstract: "A Bayeux/Faye-compatible pub/sub broker.",
        subcommands: [
            Serve.self, Bench.self, Publish.self, Subscribe.self, Sign.self, RelayCommand.self, Channels.self,
            Presence.self, Info.self, Disconnect.self,
        ],
        defaultSubcommand: nil
    )
}
